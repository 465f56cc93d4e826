// Libraries the registry must refuse; CMake builds this file once per defect
// (CIUIC_TEST_DEFECT_<name>). Every factory aborts the process: a refused plugin's factory must
// never run, and a test that reached one would crash instead of passing.
#include <cstdlib>

#include <ciuic/plugin.h>

namespace {

[[maybe_unused]] ciuic::PluginObject* abort_factory(const ciuic::PluginArgs&) { std::abort(); }

#if defined(CIUIC_TEST_DEFECT_baddefault)
const ciuic::OptionSpec kOptions[] = {
    {"bucket", ciuic::OptionType::kInt, "2e8", "an integer option with a float default"},
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

#if defined(CIUIC_TEST_DEFECT_mismatch)
constexpr ciuic::Slot kSlot = ciuic::Slot::kPrecision;
constexpr const char* kName = "other";
#elif defined(CIUIC_TEST_DEFECT_oldapi)
constexpr ciuic::Slot kSlot = ciuic::Slot::kData;
constexpr const char* kName = "oldapi";
#elif defined(CIUIC_TEST_DEFECT_otherabi)
constexpr ciuic::Slot kSlot = ciuic::Slot::kData;
constexpr const char* kName = "otherabi";
#elif defined(CIUIC_TEST_DEFECT_nofactory)
constexpr ciuic::Slot kSlot = ciuic::Slot::kData;
constexpr const char* kName = "nofactory";
#else
constexpr ciuic::Slot kSlot = ciuic::Slot::kData;
constexpr const char* kName = "baddefault";
#endif

[[maybe_unused]] const ciuic::PluginInfo* info() {
  static const ciuic::PluginInfo kInfo{kApi, kSlot, kName, "0.0.1", "a defective test plugin",
                                       kFingerprint, kOptions, 1, nullptr};
  return &kInfo;
}

}  // namespace

#if defined(CIUIC_TEST_DEFECT_nosym)
// No entry point at all: only an ordinary exported function.
extern "C" __attribute__((visibility("default"))) int ciuic_test_not_a_plugin() { return 42; }
#else
BOOST_DLL_ALIAS(info, ciuic_plugin_info)
#if !defined(CIUIC_TEST_DEFECT_nofactory)
BOOST_DLL_ALIAS(abort_factory, ciuic_plugin_create)
#endif
#endif
