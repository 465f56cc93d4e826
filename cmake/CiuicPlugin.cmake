# ciuic_add_plugin(SLOT <comm|sharding|offload|precision|data> NAME <name>
#                  SOURCES <files...> [LIBRARIES <targets...>] [INCLUDE_DIRECTORIES <dirs...>]
#                  [OUTPUT_DIRECTORY <dir>] [NO_INSTALL])
#
# Builds libciuic_<slot>_<name>.so, a MODULE library the ciuic registry can load. Works in the
# ciuic source tree and, through find_package(Ciuic), for out-of-tree plugin authors.
# The library links ciuic::core (and through it LibTorch) dynamically and is compiled with
# hidden visibility; only the two entry points defined by CIUIC_DEFINE_PLUGIN are exported.
function(ciuic_add_plugin)
  cmake_parse_arguments(P "NO_INSTALL" "SLOT;NAME;OUTPUT_DIRECTORY" "SOURCES;LIBRARIES;INCLUDE_DIRECTORIES" ${ARGN})
  if(NOT P_SLOT OR NOT P_NAME OR NOT P_SOURCES)
    message(FATAL_ERROR "ciuic_add_plugin: SLOT, NAME and SOURCES are required")
  endif()
  if(NOT P_SLOT MATCHES "^(comm|sharding|offload|precision|data)$")
    message(FATAL_ERROR "ciuic_add_plugin: SLOT must be comm, sharding, offload, precision or data (got '${P_SLOT}')")
  endif()
  set(target ciuic_${P_SLOT}_${P_NAME})
  add_library(${target} MODULE ${P_SOURCES})
  target_link_libraries(${target} PRIVATE ciuic::core ${P_LIBRARIES})
  if(P_INCLUDE_DIRECTORIES)
    target_include_directories(${target} PRIVATE ${P_INCLUDE_DIRECTORIES})
  endif()
  if(NOT P_OUTPUT_DIRECTORY)
    if(DEFINED CIUIC_PLUGIN_OUTPUT_DIR)
      set(P_OUTPUT_DIRECTORY ${CIUIC_PLUGIN_OUTPUT_DIR})
    else()
      set(P_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/plugins)
    endif()
  endif()
  set_target_properties(${target} PROPERTIES
    PREFIX "lib"
    CXX_VISIBILITY_PRESET hidden
    VISIBILITY_INLINES_HIDDEN ON
    LIBRARY_OUTPUT_DIRECTORY ${P_OUTPUT_DIRECTORY}
    BUILD_RPATH "$<TARGET_FILE_DIR:ciuic::core>"
    INSTALL_RPATH "$ORIGIN/../..;${TORCH_INSTALL_PREFIX}/lib")
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wno-unused-parameter)
  if(CIUIC_IN_TREE AND NOT P_NO_INSTALL)
    install(TARGETS ${target} LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}/ciuic/plugins)
  endif()
endfunction()
