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
