# ciuic_add_kit(<name> SOURCES <files...>): libciuic_<name>_kit.a, a static kit plugins link
# (plugins/optim/kit, plugins/data/kit). Headers in the kit's include/ciuic/kit/; linked into each
# plugin, so not part of the SDK's ABI (ciuic/plugin.h). Installed and exported for out-of-tree
# plugins as ciuic::<name>_kit. In-tree only (not installed with the SDK's CMake files).
function(ciuic_add_kit name)
  cmake_parse_arguments(K "" "" "SOURCES" ${ARGN})
  set(t ciuic_${name}_kit)
  add_library(${t} STATIC ${K_SOURCES})
  add_library(ciuic::${name}_kit ALIAS ${t})
  target_include_directories(${t} PUBLIC
    $<BUILD_INTERFACE:${CMAKE_CURRENT_SOURCE_DIR}/include>
    $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
  target_link_libraries(${t} PUBLIC ciuic::sdk)
  target_compile_options(${t} PRIVATE -Wall -Wextra -Wno-unused-parameter)
  # A sanitizer build's kit holds instrumented code: whatever links it needs the runtimes too.
  if(CIUIC_SANITIZE)
    target_link_options(${t} INTERFACE -fsanitize=address,undefined)
  elseif(CIUIC_TSAN)
    target_link_options(${t} INTERFACE -fsanitize=thread)
  endif()
  set_target_properties(${t} PROPERTIES EXPORT_NAME ${name}_kit POSITION_INDEPENDENT_CODE ON)
  install(TARGETS ${t} EXPORT CiuicTargets ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
  install(DIRECTORY include/ciuic/kit DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/ciuic FILES_MATCHING PATTERN "*.h")
endfunction()
