# CIUIC_SANITIZE=ON: ciuic's own code (core, plugins, apps, tests) built with AddressSanitizer and
# UndefinedBehaviorSanitizer; `make test SAN=1` configures it in its own folder (build-san).
# LibTorch, gloo and the other prebuilt libraries are not instrumented: ASan still checks every
# access made by ciuic code (also into LibTorch's buffers, which come from the intercepted
# malloc), UBSan checks ciuic code only. The tests run with CIUIC_SANITIZER_ENV (tests/CMakeLists
# adds it to every test; child processes inherit it): see docs/reliability.md, "Sanitizers".
option(CIUIC_SANITIZE "Build ciuic with AddressSanitizer + UndefinedBehaviorSanitizer" OFF)
set(CIUIC_SANITIZER_ENV "")
if(CIUIC_SANITIZE)
  if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "GNU" AND NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang")
    message(FATAL_ERROR "CIUIC_SANITIZE needs GCC or Clang")
  endif()
  # Errors stop the process (a test fails instead of printing a report nobody reads).
  # -g1: file and line in reports, at a fraction of full debug info's compile time.
  add_compile_options(-fsanitize=address,undefined -fno-sanitize-recover=undefined
                      -fno-omit-frame-pointer -g1)
  add_link_options(-fsanitize=address,undefined)
  set(_supp ${PROJECT_SOURCE_DIR}/tests/sanitizers)
  set(CIUIC_SANITIZER_ENV
      "ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1:detect_stack_use_after_return=0:halt_on_error=1:suppressions=${_supp}/asan.supp"
      "LSAN_OPTIONS=suppressions=${_supp}/lsan.supp:print_suppressions=0"
      "UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1:suppressions=${_supp}/ubsan.supp")
  message(STATUS "ciuic: building with ASan + UBSan (tests run with ${CIUIC_SANITIZER_ENV})")
endif()

# CIUIC_TSAN=ON: ThreadSanitizer (`make test TSAN=1`, in build-tsan). Instrumented: the SDK, the
# kits, the plugins, the apps, the conformance kit, the tests, and the engine's units that run
# threads or signal handlers (CIUIC_TSAN_ENGINE_SOURCES: launch/, app/cli.cpp, train/trainer.cpp,
# tokenizer/bpe.cpp); the rest of the engine is compiled exactly as in the plain build, so ccache
# serves it. Only the tests labelled `threaded` run (tests that start threads of ciuic's own: the
# ThreadPool and cpu_adam's update team, the data kit's prefetcher and cached_ssd's cache build,
# the conformance kit's data and optimizer checks; not gloo, whose c10d internals TSAN cannot see,
# nor the launcher's timed tests: docs/reliability.md). LibTorch, gloo and libgomp are not instrumented: what they synchronise inside is
# invisible to TSAN, so tests/sanitizers/tsan.supp may name those libraries' frames, each with its
# reason (docs/reliability.md, "Sanitizers"); ciuic's own races are fixed, not suppressed. Not
# together with CIUIC_SANITIZE (TSAN and ASan exclude each other).
option(CIUIC_TSAN "Build ciuic with ThreadSanitizer" OFF)
set(CIUIC_TSAN_COMPILE "")
if(CIUIC_TSAN)
  if(CIUIC_SANITIZE)
    message(FATAL_ERROR "CIUIC_TSAN and CIUIC_SANITIZE exclude each other (ThreadSanitizer vs AddressSanitizer)")
  endif()
  set(CIUIC_TSAN_COMPILE -fsanitize=thread -fno-omit-frame-pointer -g1)
  set(CIUIC_TSAN_ENGINE_SOURCES launch/env.cpp launch/failure.cpp launch/memory.cpp launch/store.cpp
      launch/supervise.cpp app/cli.cpp train/trainer.cpp tokenizer/bpe.cpp)
  add_link_options(-fsanitize=thread)
  set(_supp ${PROJECT_SOURCE_DIR}/tests/sanitizers)
  # halt_on_error: a race fails the test; second_deadlock_stack: both stacks of a lock inversion.
  set(CIUIC_SANITIZER_ENV
      "TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1:suppressions=${_supp}/tsan.supp")
  message(STATUS "ciuic: building with ThreadSanitizer (tests run with ${CIUIC_SANITIZER_ENV})")
endif()
