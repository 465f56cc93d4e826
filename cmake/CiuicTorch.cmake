# ciuic_torch_target(<name> PREFIX <torch package folder> CUDA <ON|OFF> [IMPORTED])
#
# Defines the INTERFACE library <name>: what every ciuic target (the core, plugins, apps, tests)
# needs from LibTorch — libraries, include folders, compile definitions. Used by the build
# (cmake/CiuicDeps.cmake: ciuic::torch) and by the installed CiuicConfig.cmake, which finds
# LibTorch again and defines it as the IMPORTED target ciuic::libtorch, so that plugin authors
# compile against exactly what the core was compiled against.
function(ciuic_torch_target name)
  cmake_parse_arguments(T "IMPORTED" "PREFIX;CUDA" "" ${ARGN})
  if(T_IMPORTED)
    add_library(${name} INTERFACE IMPORTED)
  else()
    add_library(${name} INTERFACE)
  endif()
  if(T_CUDA)
    # Torch's own config (it finds CUDA again); naming the architecture skips its GPU probe.
    if(NOT TORCH_CUDA_ARCH_LIST AND NOT DEFINED ENV{TORCH_CUDA_ARCH_LIST})
      set(TORCH_CUDA_ARCH_LIST "9.0")
    endif()
    find_package(Torch REQUIRED PATHS "${T_PREFIX}/share/cmake/Torch" NO_DEFAULT_PATH)
    target_link_libraries(${name} INTERFACE ${TORCH_LIBRARIES} CUDA::cudart)
    target_compile_definitions(${name} INTERFACE CIUIC_WITH_CUDA=1)
  else()
    # CPU-only: import torch_cpu and c10 directly. Torch's config would insist on a CUDA toolkit
    # (the PyPI wheel is a CUDA build), which a CPU machine need not have.
    find_library(CIUIC_TORCH_CPU_LIB torch_cpu PATHS "${T_PREFIX}/lib" NO_DEFAULT_PATH REQUIRED)
    find_library(CIUIC_C10_LIB c10 PATHS "${T_PREFIX}/lib" NO_DEFAULT_PATH REQUIRED)
    target_link_libraries(${name} INTERFACE ${CIUIC_TORCH_CPU_LIB} ${CIUIC_C10_LIB})
    target_include_directories(${name} SYSTEM INTERFACE
      "${T_PREFIX}/include" "${T_PREFIX}/include/torch/csrc/api/include")
    target_compile_definitions(${name} INTERFACE USE_DISTRIBUTED USE_C10D_GLOO USE_RPC
                               USE_TENSORPIPE _GLIBCXX_USE_CXX11_ABI=1)
  endif()
  # torch's fmt headers (v12) come before Debian's (v9) in include order: compile them header-only.
  target_compile_definitions(${name} INTERFACE FMT_HEADER_ONLY=1)
endfunction()

# The LibTorch version (e.g. 2.11.0) of the torch package folder `prefix`, into `out`.
function(ciuic_torch_version prefix out)
  set(_v "")
  foreach(h "${prefix}/include/torch/headeronly/version.h" "${prefix}/include/torch/csrc/api/include/torch/version.h")
    if(EXISTS "${h}")
      file(STRINGS "${h}" _tv REGEX "define TORCH_VERSION_(MAJOR|MINOR|PATCH) ")
      string(REGEX REPLACE "[^;]*MAJOR ([0-9]+);[^;]*MINOR ([0-9]+);[^;]*PATCH ([0-9]+)" "\\1.\\2.\\3" _v "${_tv}")
      break()
    endif()
  endforeach()
  set(${out} "${_v}" PARENT_SCOPE)
endfunction()
