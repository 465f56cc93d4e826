# ciuic_add_plugin(SLOT <comm|sharding|optimizer|precision|data> NAME <name>
#                  SOURCES <files...> [LIBRARIES <targets...>] [INCLUDE_DIRECTORIES <dirs...>]
#                  [OUTPUT_DIRECTORY <dir>] [NO_INSTALL])
#
# Builds libciuic_<slot>_<name>.so, a MODULE library the ciuic registry can load. Works in the
# ciuic source tree and, through find_package(Ciuic), for out-of-tree plugin authors.
# The library links the SDK, ciuic::sdk (and through it LibTorch), dynamically, plus LIBRARIES
# (e.g. the static kits ciuic::optim_kit, ciuic::data_kit), and nothing of the engine: it is
# linked with --no-undefined, so a call into libciuic (the engine) fails at link time instead of
# at load time. Compiled with hidden visibility; only the two entry points defined by
# CIUIC_DEFINE_PLUGIN are exported.
#
# Output folder: OUTPUT_DIRECTORY, else the build's plugin folder (in the ciuic tree:
# build/lib/ciuic/plugins; out of tree: <build>/plugins — pass it to ciuic-run --plugin-path).
# Installation (unless NO_INSTALL): <prefix>/lib/ciuic/plugins, where an installed ciuic-run
# finds it without --plugin-path when <prefix> is ciuic's own prefix.
include(GNUInstallDirs)

function(ciuic_add_plugin)
  cmake_parse_arguments(P "NO_INSTALL" "SLOT;NAME;OUTPUT_DIRECTORY" "SOURCES;LIBRARIES;INCLUDE_DIRECTORIES" ${ARGN})
  if(NOT P_SLOT OR NOT P_NAME OR NOT P_SOURCES)
    message(FATAL_ERROR "ciuic_add_plugin: SLOT, NAME and SOURCES are required")
  endif()
  if(P_SLOT STREQUAL "offload")
    message(FATAL_ERROR "ciuic_add_plugin: the 'offload' slot is now 'optimizer' (plugin API 3): "
                        "implement ciuic::Optimizer (ciuic/optimizer.h) and use SLOT optimizer")
  endif()
  if(NOT P_SLOT MATCHES "^(comm|sharding|optimizer|precision|data)$")
    message(FATAL_ERROR "ciuic_add_plugin: SLOT must be comm, sharding, optimizer, precision or data (got '${P_SLOT}')")
  endif()
  if(NOT P_NAME MATCHES "^[A-Za-z0-9_]+$")
    message(FATAL_ERROR "ciuic_add_plugin: NAME may hold letters, digits and '_' only (got '${P_NAME}')")
  endif()
  set(target ciuic_${P_SLOT}_${P_NAME})
  add_library(${target} MODULE ${P_SOURCES})
  target_link_libraries(${target} PRIVATE ciuic::sdk ${P_LIBRARIES})
  target_link_options(${target} PRIVATE -Wl,--no-undefined)
  target_compile_features(${target} PRIVATE cxx_std_20)
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
  # Installed next to libciuic_sdk (<prefix>/lib/ciuic/plugins -> $ORIGIN/../..); out of tree,
  # also where the ciuic package's libciuic_sdk is, in case the plugin is installed elsewhere.
  set(_rpath "$ORIGIN/../..")
  if(NOT CIUIC_IN_TREE)
    get_target_property(_core ciuic::sdk LOCATION)
    get_filename_component(_core_dir "${_core}" DIRECTORY)
    list(APPEND _rpath "${_core_dir}")
  endif()
  list(APPEND _rpath "${TORCH_INSTALL_PREFIX}/lib")
  set_target_properties(${target} PROPERTIES
    PREFIX "lib"
    CXX_VISIBILITY_PRESET hidden
    VISIBILITY_INLINES_HIDDEN ON
    LIBRARY_OUTPUT_DIRECTORY ${P_OUTPUT_DIRECTORY}
    BUILD_RPATH "$<TARGET_FILE_DIR:ciuic::sdk>"
    INSTALL_RPATH "${_rpath}")
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wno-unused-parameter)
  if(NOT P_NO_INSTALL)
    install(TARGETS ${target} LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}/ciuic/plugins)
    set_property(GLOBAL APPEND PROPERTY CIUIC_RUNTIME_PLUGINS ${target})
  endif()
endfunction()
