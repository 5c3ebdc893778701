# gradus_component(<target> <name>): the INTERFACE library gradus::<name> (exported as
# <name>) whose headers are the calling folder's include/ in the build tree and the
# installed include folder after `cmake --install`. Every backend folder (backends/compute/*,
# backends/comm/*) makes its target with it.
function(gradus_component target name)
  add_library(${target} INTERFACE)
  add_library(gradus::${name} ALIAS ${target})
  set_target_properties(${target} PROPERTIES EXPORT_NAME ${name})
  target_include_directories(${target} INTERFACE
    $<BUILD_INTERFACE:${CMAKE_CURRENT_SOURCE_DIR}/include>
    $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
endfunction()
