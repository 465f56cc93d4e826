// Registry: loading the test plugins of tests/testplugins, every refusal with its message,
// unknown names, instantiation, exceptions from factories, shadowing and library lifetime.
// The refused plugins' factories abort the process, so reaching one fails the whole test.
#include <dlfcn.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <gtest/gtest.h>

#include <ciuic/comm.h>
#include <ciuic/context.h>
#include <ciuic/data.h>
#include <ciuic/error.h>
#include <ciuic/precision.h>
#include <ciuic/version.h>

#include "recipe/recipe.h"
#include "registry/registry.h"
#include "support.h"

namespace fs = std::filesystem;
using ciuic::Registry;
using ciuic::Slot;

namespace {

const std::string kGood = CIUIC_TEST_PLUGINS + "/good";
const std::string kBad = CIUIC_TEST_PLUGINS + "/bad";
const std::string kMarker = CIUIC_TEST_PLUGINS + "/marker";

fs::path test_dir() { return ciuic_test::test_dir("registry"); }

// The refusal of the file named `file`, or "" when it was not refused.
std::string refusal_of(const Registry& r, const std::string& file) {
  for (const auto& line : r.refusals())
    if (line.find("/" + file + ": ") != std::string::npos) return line;
  return "";
}

ciuic::RunContext context() {
  ciuic::RunContext ctx;
  ctx.store = ciuic::make_local_store(std::chrono::seconds(1));
  return ctx;
}

}  // namespace

TEST(Registry, LoadsTheTestPlugins) {
  Registry r = Registry::from_paths({kGood});
  auto list = r.list();
  ASSERT_EQ(list.size(), 5u);
  const Slot order[] = {Slot::kComm, Slot::kSharding, Slot::kOptimizer, Slot::kPrecision,
                        Slot::kData};
  for (size_t i = 0; i < 5; ++i) {
    EXPECT_EQ(list[i].slot, order[i]);
    EXPECT_EQ(list[i].name, "test");
    EXPECT_EQ(list[i].path, kGood + "/libciuic_" + ciuic::slot_name(order[i]) + "_test.so");
    EXPECT_EQ(list[i].info->api_version, ciuic::kPluginApiVersion);
  }
  EXPECT_EQ(list[4].version, "0.2.0");
  EXPECT_EQ(list[4].summary, "data source for tests");
  EXPECT_EQ(list[4].info->num_options, 7u);
  EXPECT_TRUE(r.refusals().empty());
  EXPECT_TRUE(r.shadowed().empty());
  EXPECT_EQ(r.search_path(), std::vector<std::string>{kGood});
  EXPECT_NE(r.find(Slot::kData, "test"), nullptr);
  EXPECT_EQ(r.find(Slot::kData, "nope"), nullptr);
}

TEST(Registry, RefusesEachDefectWithFileExpectedAndFound) {
  Registry r = Registry::from_paths({kBad});
  EXPECT_TRUE(r.list().empty());
  EXPECT_EQ(r.refusals().size(), 11u);
  const std::string api = refusal_of(r, "libciuic_data_oldapi.so");
  EXPECT_EQ(api, kBad + "/libciuic_data_oldapi.so: plugin API version mismatch: expected " +
                     std::to_string(ciuic::kPluginApiVersion) +
                     " (ciuic " CIUIC_VERSION "), found " +
                     std::to_string(ciuic::kPluginApiVersion + 998) +
                     "; rebuild the plugin against this ciuic SDK");
  EXPECT_EQ(refusal_of(r, "libciuic_data_otherabi.so"),
            kBad + "/libciuic_data_otherabi.so: build fingerprint mismatch: expected \"" +
                ciuic::core_build_fingerprint() +
                "\", found \"torch=0.0.1;cxx11abi=0;compiler=other\"; rebuild the plugin with the "
                "same LibTorch "
                "version, C++ ABI and compiler as ciuic");
  EXPECT_EQ(
      refusal_of(r, "libciuic_data_nosym.so"),
      kBad +
          "/libciuic_data_nosym.so: not a ciuic plugin: entry symbol 'ciuic_plugin_info' not found "
          "(expected a library defined with CIUIC_DEFINE_PLUGIN)");
  EXPECT_TRUE(ciuic_test::has(refusal_of(r, "libciuic_data_nofactory.so"),
                              "entry symbol 'ciuic_plugin_create' not found"));
  EXPECT_EQ(refusal_of(r, "libciuic_data_mismatch.so"),
            kBad +
                "/libciuic_data_mismatch.so: declares slot 'precision' and name 'other' but its "
                "file name says "
                "slot 'data' and name 'mismatch' (expected file name libciuic_precision_other.so)");
  EXPECT_EQ(refusal_of(r, "libciuic_data_baddefault.so"),
            kBad +
                "/libciuic_data_baddefault.so: bad option declaration: option 'bucket': default "
                "2e8: expected "
                "an integer, found a float (2e8)");
  EXPECT_EQ(refusal_of(r, "libciuic_data_badplanned.so"),
            kBad +
                "/libciuic_data_badplanned.so: bad option declaration: option 'mode' is "
                "kOptionPlanned but its "
                "choices are not \"auto|<first>|<second>|...\" (found \"auto|only\")");
  EXPECT_EQ(refusal_of(r, "libciuic_data_badplannedint.so"),
            kBad +
                "/libciuic_data_badplannedint.so: bad option declaration: option 'share' is a "
                "kOptionPlanned "
                "integer without a finite range min < max (the planner searches it)");
  EXPECT_EQ(refusal_of(r, "libciuic_data_notalib.so"),
            kBad +
                "/libciuic_data_notalib.so: not a shared library (expected an ELF file, found "
                "other content)");
}

// Entry points must be Boost.DLL aliases (data objects holding the address of code in the same
// library). Plain extern "C" functions of those names used to be read as aliases: the loader
// called through their machine code and every command, --list-plugins included, died of SIGSEGV.
TEST(Registry, EntryPointsThatAreNotAliasesOfCodeAreRefusedNotCalled) {
  Registry r = Registry::from_paths({kGood, kBad});
  const std::string plain = refusal_of(r, "libciuic_data_plainfn.so");
  EXPECT_EQ(
      plain.rfind(
          kBad +
              "/libciuic_data_plainfn.so: not a ciuic plugin: entry symbol 'ciuic_plugin_info' is "
              "a function of ",
          0),
      0u)
      << plain;
  EXPECT_TRUE(ciuic_test::has(
      plain,
      " bytes, expected a Boost.DLL alias (a data object of 8 bytes holding the entry "
      "point's address); define the plugin with CIUIC_DEFINE_PLUGIN instead of "
      "exporting extern \"C\" functions of that name"))
      << plain;
  EXPECT_EQ(refusal_of(r, "libciuic_data_dataptr.so"),
            kBad +
                "/libciuic_data_dataptr.so: not a ciuic plugin: entry symbol 'ciuic_plugin_info' "
                "does not hold "
                "the address of code in this library (expected a Boost.DLL alias of a function, as "
                "CIUIC_DEFINE_PLUGIN defines)");
  // The other plugins of the path still load and work.
  EXPECT_EQ(r.list().size(), 5u);
  auto p = r.create<ciuic::Precision>(Slot::kPrecision, "test",
                                      ciuic::Config::from_toml("precision", ""), context());
  EXPECT_EQ(p->loss_scale(), 1.0);
  // Asking for the refused plugin names the refusal.
  try {
    r.get(Slot::kData, "plainfn");
    FAIL() << "a refused plugin was found";
  } catch (const ciuic::UsageError& e) {
    EXPECT_TRUE(
        ciuic_test::has(e.what(),
                        "libciuic_data_plainfn.so was refused: not a ciuic plugin: entry symbol "
                        "'ciuic_plugin_info' is a function"))
        << e.what();
  }
}

TEST(Registry, RefusesUnreadableAndMisnamedFiles) {
  fs::path d = test_dir();
  fs::create_symlink(d / "nowhere.so", d / "libciuic_data_dangling.so");
  fs::create_directory(d / "libciuic_data_folder.so");
  fs::copy_file(kGood + "/libciuic_data_test.so", d / "libciuic_bogus_x.so");
  std::ofstream(d / "libciuic_data_empty.so").close();
  fs::copy_file(kGood + "/libciuic_data_test.so", d / "libciuic_data_locked.so");
  ::chmod((d / "libciuic_data_locked.so").c_str(), 0);
  Registry r = Registry::from_paths({d.string()});
  const std::string p = d.string() + "/";
  EXPECT_EQ(refusal_of(r, "libciuic_data_dangling.so"),
            p + "libciuic_data_dangling.so: cannot be read: No such file or directory");
  EXPECT_EQ(refusal_of(r, "libciuic_data_folder.so"),
            p + "libciuic_data_folder.so: cannot be read: not a regular file");
  EXPECT_EQ(refusal_of(r, "libciuic_bogus_x.so"),
            p + "libciuic_bogus_x.so: file name does not follow libciuic_<slot>_<name>.so with "
                "<slot> one of comm, "
                "sharding, optimizer, precision, data");
  EXPECT_EQ(refusal_of(r, "libciuic_data_empty.so"),
            p + "libciuic_data_empty.so: not a shared library (expected an ELF file, found an "
                "empty file)");
  if (::geteuid() == 0) {
    // root reads files whatever their mode: the dangling link above stands for an unreadable file.
    EXPECT_TRUE(ciuic_test::has(refusal_of(r, "libciuic_data_locked.so"),
                                "declares slot 'data' and name 'test'"));
  } else {
    EXPECT_EQ(refusal_of(r, "libciuic_data_locked.so"),
              p + "libciuic_data_locked.so: cannot be read: Permission denied");
  }
  EXPECT_TRUE(r.list().empty());
}

TEST(Registry, UnknownNameListsAvailableAndRefused) {
  Registry r = Registry::from_paths({kGood, kBad, "/nonexistent/plugins"});
  try {
    r.get(Slot::kData, "tset");
    FAIL();
  } catch (const ciuic::UsageError& e) {
    // The names come from the files' names: the other files of the slot are not loaded (their code
    // does not run) for an error message, so the defective ones are named too.
    EXPECT_EQ(std::string(e.what()),
              "unknown data plugin 'tset'; did you mean 'test'?; available data plugins: "
              "baddefault, badplanned, "
              "badplannedint, dataptr, mismatch, oldapi, otherabi, plainfn, test (searched: " +
                  kGood + ", " + kBad +
                  ", /nonexistent/plugins (missing); add folders with --plugin-path, "
                  "$CIUIC_PLUGIN_PATH or [run] plugin_paths)");
  }
  try {
    r.get(Slot::kData, "oldapi");
    FAIL();
  } catch (const ciuic::UsageError& e) {
    EXPECT_TRUE(ciuic_test::has(
        e.what(),
        "unknown data plugin 'oldapi'; " + kBad +
            "/libciuic_data_oldapi.so was refused: plugin API version mismatch: expected " +
            std::to_string(ciuic::kPluginApiVersion) + " "))
        << e.what();
  }
  try {
    Registry::from_paths({}).get(Slot::kComm, "gloo");
    FAIL();
  } catch (const ciuic::UsageError& e) {
    EXPECT_EQ(std::string(e.what()),
              "unknown comm plugin 'gloo'; no comm plugins were found (searched: nothing; add "
              "folders with "
              "--plugin-path, $CIUIC_PLUGIN_PATH or [run] plugin_paths)");
  }
}

TEST(Registry, CreatesObjectsWithValidatedConfig) {
  Registry r = Registry::from_paths({kGood});
  ciuic::Recipe recipe = ciuic::Recipe::parse(
      "[train]\nmax_steps = 1\n[data]\nplugin = \"test\"\npath = \"x\"\nratio = 0.25\nmode = "
      "\"slow\"\n"
      "files = [\"a\", \"b\"]\n",
      "r.toml");
  const ciuic::RunContext ctx = context();
  auto data = r.create<ciuic::DataSource>(
      Slot::kData, "test", recipe.plugin_config(Slot::kData, *r.get(Slot::kData, "test").info),
      ctx);
  ciuic::Metrics m;
  data->append_metrics(m);
  auto value = [&](const std::string& k) {
    for (const auto& [key, v] : m.values)
      if (key == k) return v;
    return -999.0;
  };
  EXPECT_EQ(value("shuffle"), 1);   // default
  EXPECT_EQ(value("buffer"), 4);    // default
  EXPECT_EQ(value("ratio"), 0.25);  // written
  EXPECT_EQ(value("mode_slow"), 1);
  EXPECT_EQ(value("files"), 2);
  EXPECT_EQ(value("weights"), 1);
  EXPECT_EQ(value("weight0"), 1.0);
  EXPECT_EQ(data->cursor(), "{}");
  auto comm = r.create<ciuic::Comm>(
      Slot::kComm, "test", ciuic::Config::from_toml("comm", "fail_on_create = false"), ctx);
  EXPECT_EQ(comm->size(), 1);
  EXPECT_EQ(comm->backend_name(), "test");
}

TEST(Registry, FactoryErrorsGetThePluginContext) {
  Registry r = Registry::from_paths({kGood});
  const ciuic::RunContext ctx = context();
  try {
    r.create<ciuic::Comm>(Slot::kComm, "test",
                          ciuic::Config::from_toml("comm", "fail_on_create = true", "c.toml"), ctx);
    FAIL();
  } catch (const ciuic::Error& e) {
    EXPECT_EQ(e.exit_code(), ciuic::kExitUsage);  // the plugin's UsageError keeps its exit code
    EXPECT_EQ(
        std::string(e.what()),
        "plugin comm/test (" + kGood +
            "/libciuic_comm_test.so): c.toml:1:18: [comm] fail_on_create = true: asked to fail");
  }
  // A plain Error from a constructor: world size 2 is refused by the test comm.
  ciuic::RunContext two = context();
  two.world_size = 2;
  try {
    r.create<ciuic::Comm>(Slot::kComm, "test",
                          ciuic::Config::from_toml("comm", "fail_on_create = false"), two);
    FAIL();
  } catch (const ciuic::Error& e) {
    EXPECT_EQ(e.exit_code(), ciuic::kExitRuntime);
    EXPECT_EQ(std::string(e.what()),
              "plugin comm/test (" + kGood +
                  "/libciuic_comm_test.so): comm/test supports a world of 1 process only");
  }
  // Asking for the wrong interface.
  try {
    r.create<ciuic::Precision>(Slot::kComm, "test",
                               ciuic::Config::from_toml("comm", "fail_on_create = false"), ctx);
    FAIL();
  } catch (const ciuic::Error& e) {
    EXPECT_TRUE(ciuic_test::has(
        e.what(), "plugin comm/test (" + kGood + "/libciuic_comm_test.so) created a "))
        << e.what();
    EXPECT_TRUE(ciuic_test::has(e.what(), "which is not a ciuic::Precision")) << e.what();
  }
}

TEST(Registry, LaterPathsShadowEarlierOnes) {
  fs::path d = test_dir();
  fs::copy_file(kGood + "/libciuic_precision_test.so", d / "libciuic_precision_test.so");
  Registry r = Registry::from_paths({kGood, d.string()});
  EXPECT_EQ(r.get(Slot::kPrecision, "test").path, (d / "libciuic_precision_test.so").string());
  ASSERT_EQ(r.shadowed().size(), 1u);
  EXPECT_EQ(r.shadowed()[0], kGood + "/libciuic_precision_test.so: shadowed by " +
                                 (d / "libciuic_precision_test.so").string());
  EXPECT_EQ(r.list().size(), 5u);
  // A plugin file can be named directly; the same folder twice is scanned once.
  Registry one = Registry::from_paths({kGood + "/libciuic_data_test.so", kGood, kGood + "/"});
  EXPECT_EQ(one.list().size(), 5u);
  EXPECT_TRUE(one.shadowed().empty());
}

// Discovery runs no code of the files it finds: a plugin is loaded (its constructors run) only when
// asked for by slot and name — the plugins a recipe names — or when everything is listed
// (--list-plugins). Before, every libciuic_*.so of the search path was dlopen'ed, for
// --print-recipe and --plan too. A library named like a plugin that is none is refused with a
// warning from its symbol table, never loaded.
TEST(Registry, LoadsOnlyThePluginsAskedFor) {
  const std::string marker = (test_dir() / "marker.txt").string();
  ::setenv("CIUIC_TEST_MARKER", marker.c_str(), 1);
  auto marks = [&] {
    std::ifstream in(marker);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  ::testing::internal::CaptureStderr();
  Registry r = Registry::from_paths({kGood, kMarker});
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(marks(), "") << "discovery ran a plugin's code";
  EXPECT_TRUE(ciuic_test::has(log, "plugin path: " + kMarker +
                                       "/libciuic_data_notaplugin.so is not loaded: not a "
                                       "ciuic plugin: entry symbol 'ciuic_plugin_info' not found"))
      << log;
  EXPECT_NE(r.find(Slot::kData, "test"), nullptr);
  r.create<ciuic::Precision>(Slot::kPrecision, "test", ciuic::Config::from_toml("precision", ""),
                             context());
  EXPECT_EQ(marks(), "") << "asking for other plugins loaded precision/marker";
  EXPECT_EQ(r.get(Slot::kPrecision, "marker").name, "marker");
  EXPECT_EQ(marks(), "marker loaded\n");
  EXPECT_EQ(refusal_of(r, "libciuic_data_notaplugin.so"),
            kMarker +
                "/libciuic_data_notaplugin.so: not a ciuic plugin: entry symbol "
                "'ciuic_plugin_info' not found "
                "(expected a library defined with CIUIC_DEFINE_PLUGIN)");
  EXPECT_EQ(r.list().size(), 6u);
  EXPECT_EQ(marks(), "marker loaded\n") << "the library that is not a plugin was loaded";
  ::unsetenv("CIUIC_TEST_MARKER");
}

// Two files of one slot and name: a warning names the one used and the one it shadows.
TEST(Registry, ShadowingIsWarnedNamingBothFiles) {
  fs::path d = test_dir();
  fs::copy_file(kGood + "/libciuic_precision_test.so", d / "libciuic_precision_test.so");
  ::testing::internal::CaptureStderr();
  Registry r = Registry::from_paths({kGood, d.string()});
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_TRUE(
      ciuic_test::has(log, "plugin precision/test: " + (d / "libciuic_precision_test.so").string() +
                               " shadows " + kGood +
                               "/libciuic_precision_test.so (the last one found in "
                               "the plugin search path is used)"))
      << log;
  EXPECT_EQ(r.get(Slot::kPrecision, "test").path, (d / "libciuic_precision_test.so").string());
}

TEST(Registry, DiscoverReadsTheEnvironment) {
  ::setenv("CIUIC_PLUGIN_PATH", (kBad + ":" + kGood).c_str(), 1);
  Registry r = Registry::discover({"/nonexistent/extra"});
  ::unsetenv("CIUIC_PLUGIN_PATH");
  auto path = r.search_path();
  ASSERT_GE(path.size(), 3u);
  EXPECT_EQ(path[path.size() - 3], kBad);
  EXPECT_EQ(path[path.size() - 2], kGood);
  EXPECT_EQ(path.back(), "/nonexistent/extra (missing)");
  EXPECT_NE(r.find(Slot::kSharding, "test"), nullptr);
}

TEST(Registry, ObjectsKeepTheirLibraryAndLibrariesStayLoaded) {
  std::shared_ptr<ciuic::Precision> p;
  {
    Registry r = Registry::from_paths({kGood});
    p = r.create<ciuic::Precision>(Slot::kPrecision, "test",
                                   ciuic::Config::from_toml("precision", ""), context());
  }
  // The registry is gone; the object's code still runs.
  EXPECT_EQ(p->loss_scale(), 1.0);
  EXPECT_EQ(p->param_dtype(), at::kFloat);
  p.reset();
  // RTLD_NODELETE: even with no object left, the library is still mapped.
  void* h = ::dlopen((kGood + "/libciuic_precision_test.so").c_str(), RTLD_NOW | RTLD_NOLOAD);
  EXPECT_NE(h, nullptr);
  if (h) ::dlclose(h);
  // Refused libraries too (their static initialisers ran).
  Registry bad = Registry::from_paths({kBad});
  EXPECT_FALSE(bad.refusals().empty());  // tried (loaded) every file
  h = ::dlopen((kBad + "/libciuic_data_otherabi.so").c_str(), RTLD_NOW | RTLD_NOLOAD);
  EXPECT_NE(h, nullptr);
  if (h) ::dlclose(h);
}
