// Libraries the registry must refuse; CMake builds this file once per defect
// (CIUIC_TEST_DEFECT_<name>). Every factory aborts the process: a refused plugin's factory must
// never run, and a test that reached one would crash instead of passing. Entry points that are not
// Boost.DLL aliases of code (plainfn, dataptr) must be refused without being called or followed.
#define CIUIC_PLUGIN_API 7
#include <cstdlib>

#include <ciuic/plugin.h>

namespace {

[[maybe_unused]] ciuic::PluginObject* abort_factory(const ciuic::PluginArgs&) { std::abort(); }

#if defined(CIUIC_TEST_DEFECT_baddefault)
const ciuic::OptionSpec kOptions[] = {
    {"bucket", ciuic::OptionType::kInt, "2e8", "an integer option with a float default"},
};
#elif defined(CIUIC_TEST_DEFECT_badplanned)
// The planner picks the first fitting choice after "auto": one choice leaves nothing to choose.
const ciuic::OptionSpec kOptions[] = {
    {"mode", ciuic::OptionType::kString, "\"auto\"", "a planned option with one choice", NAN, NAN,
     "auto|only", ciuic::kOptionPlanned},
};
#elif defined(CIUIC_TEST_DEFECT_badplannedint)
// A planned integer is searched between min and max: without a maximum there is no range.
const ciuic::OptionSpec kOptions[] = {
    {"share", ciuic::OptionType::kInt, "0", "a planned integer without a maximum", 0, NAN, nullptr,
     ciuic::kOptionPlanned},
};
#else
const ciuic::OptionSpec kOptions[] = {
    {"x", ciuic::OptionType::kInt, "1", "an option"},
};
#endif

#if defined(CIUIC_TEST_DEFECT_oldapi)
constexpr uint32_t kApi = ciuic::kPluginApiVersion + 998;
#else
constexpr uint32_t kApi = ciuic::kPluginApiVersion;
#endif

#if defined(CIUIC_TEST_DEFECT_otherabi)
constexpr const char* kFingerprint = "torch=0.0.1;cxx11abi=0;compiler=other";
#else
constexpr const char* kFingerprint = CIUIC_BUILD_FINGERPRINT;
#endif

// The slot and name the info record declares: those of the file name (data, the defect's name,
// CIUIC_TEST_DEFECT_NAME from CMake), except for the defect that declares others.
#if defined(CIUIC_TEST_DEFECT_mismatch)
constexpr ciuic::Slot kSlot = ciuic::Slot::kPrecision;
constexpr const char* kName = "other";
#else
constexpr ciuic::Slot kSlot = ciuic::Slot::kData;
constexpr const char* kName = CIUIC_TEST_DEFECT_NAME;
#endif

[[maybe_unused]] const ciuic::PluginInfo* info() {
  static const ciuic::PluginInfo kInfo{
      kApi, kSlot, kName, "0.0.1", "a defective test plugin", kFingerprint, kOptions, 1, nullptr};
  return &kInfo;
}

}  // namespace

#if defined(CIUIC_TEST_DEFECT_plainfn)
// The entry points as plain extern "C" functions, not Boost.DLL aliases: a loader that read them
// as aliases would take their first machine-code bytes for an address and jump there (SIGSEGV).
extern "C" __attribute__((visibility("default"))) const ciuic::PluginInfo* ciuic_plugin_info() {
  return info();
}
extern "C" __attribute__((visibility("default"))) ciuic::PluginObject* ciuic_plugin_create(
    const ciuic::PluginArgs& a) {
  return abort_factory(a);
}
#elif defined(CIUIC_TEST_DEFECT_dataptr)
// An alias-shaped data object (pointer-sized) that holds the address of data, not of code: calling
// it would execute data (SIGSEGV on a non-executable page).
namespace {
unsigned char g_not_code[16];  // writable data: never on an executable page
}
extern "C" __attribute__((visibility("default"))) const void* const ciuic_plugin_info = g_not_code;
BOOST_DLL_ALIAS(abort_factory, ciuic_plugin_create)
#elif defined(CIUIC_TEST_DEFECT_nosym)
// No entry point at all: only an ordinary exported function.
extern "C" __attribute__((visibility("default"))) int ciuic_test_not_a_plugin() { return 42; }
#else
BOOST_DLL_ALIAS(info, ciuic_plugin_info)
#if !defined(CIUIC_TEST_DEFECT_nofactory)
BOOST_DLL_ALIAS(abort_factory, ciuic_plugin_create)
#endif
#endif
