// Test plugin precision/marker (and, built with CIUIC_TEST_NOT_A_PLUGIN, a library named like a
// plugin that is not one): a static constructor appends this file's name to the file named by
// $CIUIC_TEST_MARKER, so that a test sees whether the registry loaded it (ran its code).
#define CIUIC_PLUGIN_API 7
#include <cstdio>
#include <cstdlib>

#ifndef CIUIC_TEST_NOT_A_PLUGIN
#include <ciuic/precision.h>
#endif

namespace {

#ifdef CIUIC_TEST_NOT_A_PLUGIN
constexpr const char* kWho = "notaplugin";
#else
constexpr const char* kWho = "marker";
#endif

struct Marker {
  Marker() {
    if (const char* f = std::getenv("CIUIC_TEST_MARKER")) {
      if (FILE* out = std::fopen(f, "a")) {
        std::fprintf(out, "%s loaded\n", kWho);
        std::fclose(out);
      }
    }
  }
} marker;

#ifndef CIUIC_TEST_NOT_A_PLUGIN
class MarkerPrecision final : public ciuic::Precision {};  // Precision's defaults: plain fp32
#endif

}  // namespace

#ifndef CIUIC_TEST_NOT_A_PLUGIN
CIUIC_DEFINE_PLUGIN_NO_OPTIONS(ciuic::Slot::kPrecision, "marker", "0.1.0",
                               "writes a marker file when loaded (tests)",
                               [](const ciuic::PluginArgs&) -> ciuic::PluginObject* {
                                 return new MarkerPrecision();
                               })
#else
extern "C" int ciuic_test_not_a_plugin() { return 42; }
#endif
