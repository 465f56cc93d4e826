# Finds ciuic's dependencies (DESIGN §11). Every find here is also what an installed
# CiuicConfig.cmake repeats for plugin authors (see CiuicConfig.cmake.in).

# ---- LibTorch: from the torch wheel (found through torch.utils.cmake_prefix_path) -------------
if(NOT Torch_DIR AND NOT DEFINED ENV{Torch_DIR})
  foreach(py "${CMAKE_SOURCE_DIR}/.venv/bin/python" python3)
    execute_process(COMMAND ${py} -c "import os, importlib.util as u; s=u.find_spec('torch'); print(os.path.join(os.path.dirname(s.origin), 'share', 'cmake'))"
                    OUTPUT_VARIABLE _ciuic_torch_prefix OUTPUT_STRIP_TRAILING_WHITESPACE
                    RESULT_VARIABLE _rc ERROR_QUIET)
    if(_rc EQUAL 0 AND EXISTS "${_ciuic_torch_prefix}/Torch")
      list(APPEND CMAKE_PREFIX_PATH "${_ciuic_torch_prefix}")
      break()
    endif()
  endforeach()
endif()
# Where the torch wheel keeps LibTorch: <site-packages>/torch (its cmake prefix is share/cmake below).
if(NOT CIUIC_TORCH_PREFIX)
  foreach(p ${CMAKE_PREFIX_PATH} $ENV{CMAKE_PREFIX_PATH})
    foreach(cand "${p}/../.." "${p}")
      if(EXISTS "${cand}/include/torch/csrc/api/include/torch/version.h" AND EXISTS "${cand}/lib/libtorch_cpu.so")
        get_filename_component(CIUIC_TORCH_PREFIX "${cand}" ABSOLUTE)
        break()
      endif()
    endforeach()
    if(CIUIC_TORCH_PREFIX)
      break()
    endif()
  endforeach()
endif()
if(NOT CIUIC_TORCH_PREFIX)
  message(FATAL_ERROR "LibTorch not found: run scripts/setup-deps.sh (it installs torch into .venv), "
                      "or pass -DCMAKE_PREFIX_PATH=$(python3 -c 'import torch;print(torch.utils.cmake_prefix_path)')")
endif()
set(CIUIC_TORCH_PREFIX "${CIUIC_TORCH_PREFIX}" CACHE PATH "LibTorch (the torch package folder)")
get_filename_component(CIUIC_TORCH_PREFIX "${CIUIC_TORCH_PREFIX}" ABSOLUTE)
include(CiuicTorch)
ciuic_torch_version("${CIUIC_TORCH_PREFIX}" CIUIC_TORCH_VERSION)

# ---- CUDA / NCCL --------------------------------------------------------------------------------
set(CIUIC_HAVE_CUDA OFF)
if(NOT CIUIC_WITH_CUDA STREQUAL "OFF")
  find_package(CUDAToolkit QUIET)
  find_path(CIUIC_NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS} ENV NCCL_HOME PATH_SUFFIXES include)
  find_library(CIUIC_NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR} ${CUDAToolkit_LIBRARY_ROOT}/lib ENV NCCL_HOME PATH_SUFFIXES lib lib64)
  if(CUDAToolkit_FOUND AND CIUIC_NCCL_INCLUDE_DIR AND CIUIC_NCCL_LIBRARY)
    set(CIUIC_HAVE_CUDA ON)
  elseif(CIUIC_WITH_CUDA STREQUAL "ON")
    message(FATAL_ERROR "CIUIC_WITH_CUDA=ON but the CUDA toolkit (found: ${CUDAToolkit_FOUND}) or NCCL "
                        "(${CIUIC_NCCL_INCLUDE_DIR} ${CIUIC_NCCL_LIBRARY}) was not found")
  endif()
endif()

# ciuic::torch — what every ciuic target links (cmake/CiuicTorch.cmake, shared with the installed
# CiuicConfig.cmake).
ciuic_torch_target(ciuic_torch PREFIX "${CIUIC_TORCH_PREFIX}" CUDA ${CIUIC_HAVE_CUDA})
set(TORCH_INSTALL_PREFIX "${CIUIC_TORCH_PREFIX}")
add_library(ciuic::torch ALIAS ciuic_torch)
message(STATUS "ciuic: LibTorch ${CIUIC_TORCH_VERSION} at ${CIUIC_TORCH_PREFIX}; CUDA/NCCL parts: ${CIUIC_HAVE_CUDA}")

# The c10d headers ship with the wheel; ProcessGroupGloo.hpp needs gloo's own headers, which
# Debian's libgloo-dev provides (headers only: libtorch carries its own gloo symbols).
find_path(CIUIC_GLOO_INCLUDE_DIR gloo/config.h)

# ---- the rest -------------------------------------------------------------------------------------
set(Boost_NO_WARN_NEW_VERSIONS ON)
find_package(Boost 1.74 REQUIRED COMPONENTS program_options)
find_package(tomlplusplus QUIET)
if(NOT tomlplusplus_FOUND)
  find_path(CIUIC_TOMLPP_INCLUDE toml++/toml.h REQUIRED)
  add_library(tomlplusplus_tomlplusplus INTERFACE)
  target_include_directories(tomlplusplus_tomlplusplus INTERFACE ${CIUIC_TOMLPP_INCLUDE})
  add_library(tomlplusplus::tomlplusplus ALIAS tomlplusplus_tomlplusplus)
endif()
find_package(nlohmann_json 3.9 REQUIRED)
find_package(Threads REQUIRED)
