# ciuic_cuda_kernels(TARGET INTO DEFINE SOURCES ...): the CUDA kernels of TARGET (the engine or a
# kit), compiled by nvcc on their own — without LibTorch: they take raw pointers — into an object
# library whose objects land inside TARGET, which also gets DEFINE=1 so its C++ side calls them.
# Only in CUDA builds (CIUIC_HAVE_CUDA); elsewhere the callers keep their ATen paths.
function(ciuic_cuda_kernels target)
  cmake_parse_arguments(K "" "INTO;DEFINE" "SOURCES" ${ARGN})
  if(NOT CIUIC_HAVE_CUDA)
    return()
  endif()
  add_library(${K_INTO} OBJECT ${K_SOURCES})
  set_target_properties(${K_INTO} PROPERTIES POSITION_INDEPENDENT_CODE ON CUDA_STANDARD 17)
  target_include_directories(${K_INTO} PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/src)
  target_compile_options(${K_INTO} PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:-O3>)
  target_sources(${target} PRIVATE $<TARGET_OBJECTS:${K_INTO}>)
  target_compile_definitions(${target} PRIVATE ${K_DEFINE}=1)
endfunction()
