// The installed SDK: `cmake --install` into a prefix, moved elsewhere (relocatable), the
// out-of-tree example plugins (examples/hello_plugin, zero1_plugin, lion_plugin) configured with
// find_package(Ciuic) and built against it — the SDK and the kits only — then listed and
// instantiated by the installed ciuic-run. The umbrella header ciuic/ciuic.h and every kit header
// compile from the installed prefix, in a GoogleTest program on the installed conformance kit; the
// installed ciuic-plugin-check passes the hello example. A plugin that calls into the engine fails
// to link.
// The example builds are kept in <build>/sdk-examples for sdk_examples_test (a ctest fixture).
#include <cctype>
#include <ciuic/files.h>
#include <filesystem>
#include <fstream>
#include <string>

#include <gtest/gtest.h>

#include <ciuic/plugin.h>
#include <ciuic/version.h>

#include "support.h"

namespace fs = std::filesystem;

namespace {

using ciuic_test::has;
using ciuic_test::Result;
using ciuic_test::slurp;

}  // namespace

TEST(Sdk, InstalledPackageBuildsAndRunsAnOutOfTreePlugin) {
  const fs::path root = fs::path(CIUIC_TEST_TMP) / "sdk";
  {
    std::error_code rm_ec;
    ciuic::remove_tree(std::filesystem::path(root).string(), rm_ec);
  }
  fs::create_directories(root / "io");
  const fs::path io = root / "io", first = root / "first-prefix", prefix = root / "prefix";
  const std::string cmake = CIUIC_CMAKE_COMMAND;
  // The nested builds' ccache keys hold paths relative to the source tree (as the main build's
  // do), so a fresh clone hits what another clone compiled.
  const std::string build_cmd =
      "CCACHE_BASEDIR=" + CIUIC_SOURCE_DIR + " CCACHE_NOHASHDIR=1 " + cmake + " --build ";

  Result r = ciuic_test::run_command(
      cmake + " --install " + CIUIC_BUILD_DIR + " --prefix " + first.string(), io);
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  fs::rename(first, prefix);  // nothing may refer to where it was installed

  for (const char* f : {"bin/ciuic-run",
                        "lib/libciuic.so",
                        "lib/libciuic_sdk.so",
                        "lib/libciuic_optim_kit.a",
                        "lib/libciuic_data_kit.a",
                        "include/ciuic/plugin.h",
                        "include/ciuic/version.h",
                        "include/ciuic/optimizer.h",
                        "include/ciuic/kit/bucket_sharding.h",
                        "include/ciuic/kit/shard_optimizer.h",
                        "include/ciuic/kit/packed_stream.h",
                        "include/ciuic/kit/packing.h",
                        "include/ciuic/ciuic.h",
                        "include/ciuic/testing/conformance.h",
                        "bin/ciuic-plugin-check",
                        "lib/libciuic_conformance.a",
                        "lib/cmake/Ciuic/CiuicConformanceTargets.cmake",
                        "lib/cmake/Ciuic/CiuicConfig.cmake",
                        "lib/cmake/Ciuic/CiuicConfigVersion.cmake",
                        "lib/cmake/Ciuic/CiuicTargets.cmake",
                        "lib/cmake/Ciuic/CiuicPlugin.cmake",
                        "lib/ciuic/plugins"})
    EXPECT_TRUE(fs::exists(prefix / f)) << f;
  // Every plugin of the build is installed; none of the test-only plugins is.
  if (fs::exists(CIUIC_PLUGIN_DIR))
    for (const auto& e : fs::directory_iterator(CIUIC_PLUGIN_DIR))
      EXPECT_TRUE(fs::exists(prefix / "lib/ciuic/plugins" / e.path().filename())) << e.path();
  EXPECT_FALSE(fs::exists(prefix / "lib/ciuic/plugins/libciuic_data_test.so"));
  // The package files name neither the build tree nor the first prefix.
  for (const auto& e : fs::directory_iterator(prefix / "lib/cmake/Ciuic")) {
    const std::string text = slurp(e.path());
    EXPECT_FALSE(has(text, CIUIC_BUILD_DIR)) << e.path();
    EXPECT_FALSE(has(text, first.string())) << e.path();
  }
  // The installed ciuic-run loads the installed libciuic and lists the installed plugins.
  r = ciuic_test::run_command("ldd " + (prefix / "bin/ciuic-run").string(), io);
  const size_t at = r.out.find("libciuic.so.0 => ");
  ASSERT_NE(at, std::string::npos) << r.out;
  const size_t from = at + 17, to = r.out.find(" (", from);
  EXPECT_EQ(fs::weakly_canonical(r.out.substr(from, to - from)),
            fs::weakly_canonical(prefix / "lib/libciuic.so.0"))
      << r.out;
  r = ciuic_test::run_command((prefix / "bin/ciuic-run").string() + " --list-plugins", io);
  EXPECT_EQ(r.code, 0) << r.err;
  for (const auto& e : fs::directory_iterator(prefix / "lib/ciuic/plugins"))
    EXPECT_TRUE(has(r.out, e.path().string() + "\n")) << e.path() << "\n" << r.out;

  // No engine header is installed: plugins see the SDK and the kits only.
  for (const char* f :
       {"include/ciuic/recipe.h", "include/recipe/recipe.h", "include/train/worker.h"})
    EXPECT_FALSE(fs::exists(prefix / f)) << f;

  // Configure and build the examples against the moved prefix.
  const fs::path examples = fs::path(CIUIC_BUILD_DIR) / "sdk-examples";
  {
    std::error_code rm_ec;
    ciuic::remove_tree(std::filesystem::path(examples).string(), rm_ec);
  }
  const fs::path hello = examples / "hello";
  auto configure_dir = [&](const std::string& source, const fs::path& build,
                           const std::string& extra) {
    std::string c = cmake + " -S " + source + " -B " + build.string() +
                    " -G '" CIUIC_CMAKE_GENERATOR "' -DCMAKE_MAKE_PROGRAM=" CIUIC_CMAKE_MAKE_PROGRAM
                    " -DCMAKE_CXX_COMPILER=" CIUIC_CXX_COMPILER
                    " -DCMAKE_BUILD_TYPE=Release"
                    " -DCMAKE_PREFIX_PATH=" +
                    prefix.string() + extra;
    const std::string ccache = CIUIC_CCACHE;
    if (!ccache.empty() && ccache.find("NOTFOUND") == std::string::npos)
      c += " -DCMAKE_CXX_COMPILER_LAUNCHER=" + ccache;
    return ciuic_test::run_command(c, io);
  };
  auto configure = [&](const fs::path& build, const std::string& extra) {
    return configure_dir(CIUIC_SOURCE_DIR + "/examples/hello_plugin", build, extra);
  };
  r = configure(hello, "");
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  // The package insists on the LibTorch version ciuic was built with.
  const fs::path fake = root / "fake-torch";
  fs::create_directories(fake / "lib");
  fs::create_directories(fake / "include/torch/headeronly");
  ciuic_test::write_file(fake / "lib/libtorch_cpu.so", "");
  ciuic_test::write_file(fake / "include/torch/headeronly/version.h",
                         "#define TORCH_VERSION_MAJOR 1\n#define TORCH_VERSION_MINOR 2\n#define "
                         "TORCH_VERSION_PATCH 3\n");
  Result bad = configure(root / "hello-fake", " -DCIUIC_TORCH_PREFIX=" + fake.string());
  {
    std::error_code rm_ec;
    ciuic::remove_tree(std::filesystem::path(root / "hello-fake").string(), rm_ec);
  }
  EXPECT_NE(bad.code, 0);
  std::string said;  // CMake wraps the reason: compare with whitespace runs as single spaces
  for (char ch : bad.out + bad.err)
    if (!std::isspace(static_cast<unsigned char>(ch)))
      said += ch;
    else if (!said.empty() && said.back() != ' ')
      said += ' ';
  EXPECT_TRUE(
      has(said, "is version 1.2.3, but ciuic " CIUIC_VERSION " was built against " TORCH_VERSION))
      << said;
  r = ciuic_test::run_command(build_cmd + hello.string(), io);
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  const fs::path plugin = hello / "plugins" / "libciuic_precision_hello.so";
  ASSERT_TRUE(fs::exists(plugin));

  const std::string run = (prefix / "bin/ciuic-run").string();
  r = ciuic_test::run_command(
      run + " --list-plugins --verbose --plugin-path " + (hello / "plugins").string(), io);
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(has(r.out, "precision hello")) << r.out;
  EXPECT_TRUE(has(r.out, "1.0.0") && has(r.out, plugin.string() + "\n")) << r.out;
  EXPECT_TRUE(has(r.out, "loss_scale = 1.0")) << r.out;
  EXPECT_EQ(r.err, "");

  // A dry run of a recipe choosing it (the other slots from the test plugins of the build).
  const fs::path recipe = root / "hello.toml";
  std::ofstream(recipe) << "[train]\nmax_steps = 1\n"
                           "[comm]\nplugin = \"test\"\n[sharding]\nplugin = \"test\"\n"
                           "[optimizer]\nplugin = \"test\"\n"
                           "[data]\nplugin = \"test\"\npath = \"x\"\n"
                           "[precision]\nplugin = \"hello\"\ngreeting = \"hi from the SDK test\"\n";
  const std::string paths = " --plugin-path " + CIUIC_TEST_PLUGINS + "/good --plugin-path " +
                            (hello / "plugins").string();
  r = ciuic_test::run_command(run + " " + recipe.string() + paths + " --dry-run", io);
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_TRUE(has(r.out, "precision hello")) << r.out;
  EXPECT_TRUE(has(r.out, plugin.string())) << r.out;
  EXPECT_TRUE(has(r.err, "precision/hello: hi from the SDK test (static loss scale 1.0")) << r.err;
  // Its own check, reported with the recipe location.
  r = ciuic_test::run_command(
      run + " " + recipe.string() + paths + " --dry-run --set 'precision.greeting=\"\"'", io);
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(has(r.err, "ciuic-run: error: plugin precision/hello (" + plugin.string() +
                             "): --set: [precision] greeting = \"\": must not be empty"))
      << r.err;

  // The examples on the kits: ZeRO-1 (sharding) and Lion (optimizer) on the optim kit, `lines`
  // (data) on the data kit, built with the SDK and a kit alone (sdk_examples_test trains with
  // them).
  for (const char* name : {"zero1", "lion", "lines"}) {
    const fs::path build = examples / name;
    r = configure_dir(std::string(CIUIC_SOURCE_DIR + "/examples/") + name + "_plugin", build, "");
    ASSERT_EQ(r.code, 0) << name << "\n" << r.out << r.err;
    r = ciuic_test::run_command(build_cmd + build.string(), io);
    ASSERT_EQ(r.code, 0) << name << "\n" << r.out << r.err;
  }
  r = ciuic_test::run_command(run + " --list-plugins --plugin-path " +
                                  (examples / "zero1/plugins").string() + " --plugin-path " +
                                  (examples / "lion/plugins").string(),
                              io);
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(has(r.out, "sharding  zero1")) << r.out;
  EXPECT_TRUE(has(r.out, "optimizer lion")) << r.out;

  // The umbrella header and every kit header compile from the installed SDK, together in one TU
  // (tests/headers checks each header alone in the build tree), in a GoogleTest program on the
  // installed conformance kit (ciuic::conformance) that holds the hello example to its contract.
  const fs::path umbrella = root / "umbrella";
  fs::create_directories(umbrella);
  std::string kit_includes;
  for (const auto& e : fs::directory_iterator(prefix / "include/ciuic/kit"))
    kit_includes += "#include <ciuic/kit/" + e.path().filename().string() + ">\n";
  ciuic_test::write_file(
      umbrella / "CMakeLists.txt",
      "cmake_minimum_required(VERSION 3.22)\nproject(umbrella LANGUAGES CXX)\n"
      "find_package(GTest REQUIRED)\nfind_package(Ciuic 0.1 REQUIRED)\n"
      "add_executable(umbrella umbrella.cpp)\n"
      "target_compile_options(umbrella PRIVATE -Wall -Wextra -Werror)\n"
      "target_link_libraries(umbrella PRIVATE ciuic::sdk ciuic::optim_kit ciuic::data_kit\n"
      "                      ciuic::conformance GTest::gtest_main)\n");
  ciuic_test::write_file(umbrella / "umbrella.cpp",
                         "#include <ciuic/ciuic.h>\n" + kit_includes +
                             "#include <ciuic/testing/conformance.h>\n#include <gtest/gtest.h>\n"
                             "TEST(Hello, Conforms) {\n"
                             "  auto p = ciuic::conformance::PluginUnderTest::load(\"" +
                             plugin.string() +
                             "\");\n"
                             "  EXPECT_EQ(p.slot(), ciuic::Slot::kPrecision);\n"
                             "  ciuic::conformance::CheckOptions o;\n  o.expect_scale = 1.0;\n"
                             "  ciuic::conformance::check_plugin(p, o);\n}\n");
  r = configure_dir(umbrella.string(), root / "umbrella_build", "");
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  r = ciuic_test::run_command(build_cmd + (root / "umbrella_build").string(), io);
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  r = ciuic_test::run_command((root / "umbrella_build/umbrella").string() + " --gtest_color=no",
                              io);
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_TRUE(has(r.out, "[  PASSED  ] 1 test")) << r.out;
  // The installed ciuic-plugin-check: the hello example passes; with a wrong expectation it fails,
  // naming the rule (exit code 1).
  const std::string check = (prefix / "bin/ciuic-plugin-check").string() + " " + plugin.string();
  r = ciuic_test::run_command(check + " --expect-scale 1 --gtest_color=no", io);
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_TRUE(
      has(r.out, "ciuic-plugin-check: precision plugin hello 1.0.0 (" + plugin.string() + ")"))
      << r.out;
  r = ciuic_test::run_command(check + " --expect-scale 2 --gtest_color=no", io);
  EXPECT_EQ(r.code, 1) << r.out << r.err;
  EXPECT_TRUE(has(r.out, "loss_scale()")) << r.out;

  // A plugin that calls a function of the engine (libciuic: here the tokenizer loader, declared by
  // hand since no engine header is installed) does not link: plugins link the SDK alone.
  const fs::path badsrc = root / "engine_call";
  fs::create_directories(badsrc);
  ciuic_test::write_file(
      badsrc / "CMakeLists.txt",
      "cmake_minimum_required(VERSION 3.22)\nproject(engine_call LANGUAGES CXX)\n"
      "find_package(Ciuic 0.1 REQUIRED)\n"
      "ciuic_add_plugin(SLOT data NAME engine_call SOURCES engine_call.cpp)\n"
      "ciuic_add_plugin(SLOT data NAME old_api SOURCES old_api.cpp)\n");
  // Source written for plugin API 6: it must not compile against API 7's headers.
  ciuic_test::write_file(
      badsrc / "old_api.cpp",
      "#define CIUIC_PLUGIN_API 6\n#include <ciuic/plugin.h>\n"
      "namespace { ciuic::PluginObject* make(const ciuic::PluginArgs&) { return nullptr; } }\n"
      "CIUIC_DEFINE_PLUGIN_NO_OPTIONS(ciuic::Slot::kData, \"old_api\", \"0.1\", \"old\", make)\n");
  ciuic_test::write_file(
      badsrc / "engine_call.cpp",
      "#include <memory>\n#include <string>\n#include <ciuic/plugin.h>\n"
      "namespace ciuic { class Tokenizer;\n"
      "std::shared_ptr<const Tokenizer> load_tokenizer(const std::string& path); }\n"
      "namespace { ciuic::PluginObject* make(const ciuic::PluginArgs&) {\n"
      "  ciuic::load_tokenizer(\"x\"); return nullptr; } }\n"
      "CIUIC_DEFINE_PLUGIN_NO_OPTIONS(ciuic::Slot::kData, \"engine_call\", \"0.1\", \"calls the "
      "engine\", make)\n");
  r = configure_dir(badsrc.string(), root / "engine_call_build", "");
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  r = ciuic_test::run_command(
      build_cmd + (root / "engine_call_build").string() + " --target ciuic_data_engine_call", io);
  EXPECT_NE(r.code, 0) << r.out << r.err;
  EXPECT_TRUE(has(r.out + r.err, "undefined reference to `ciuic::load_tokenizer"))
      << r.out << r.err;
  // engine_call.cpp does not say which plugin API it was written for: a warning naming API 7's
  // changes.
  EXPECT_TRUE(
      has(r.out + r.err, "this plugin source does not say which plugin API it was written for"))
      << r.out << r.err;
  EXPECT_TRUE(has(r.out + r.err, "changed Sharding::step into finish_grads() + update()"))
      << r.out << r.err;
  // old_api.cpp says API 6: an error naming what API 7 changed.
  r = ciuic_test::run_command(
      build_cmd + (root / "engine_call_build").string() + " --target ciuic_data_old_api", io);
  EXPECT_NE(r.code, 0) << r.out << r.err;
  EXPECT_TRUE(has(r.out + r.err, "this plugin is written for plugin API < 7; API 7 changed"))
      << r.out << r.err;
  {
    std::error_code rm_ec;
    ciuic::remove_tree(std::filesystem::path(root).string(), rm_ec);
  }
}
