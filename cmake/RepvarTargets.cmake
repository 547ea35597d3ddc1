# SPDX-License-Identifier: Apache-2.0
# Warnings, sanitizers, the C++ standard and include roots in one place.

add_library(repvar_warnings INTERFACE)
target_compile_options(repvar_warnings INTERFACE
  -Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor
  -Wno-missing-field-initializers  # GCC 12 warns on designated initializers
  $<$<CXX_COMPILER_ID:Clang>:-Wthread-safety>
  $<$<BOOL:${REPVAR_WERROR}>:-Werror>)

add_library(repvar_sanitize INTERFACE)
if(REPVAR_SANITIZE)
  string(REPLACE ";" "," _repvar_san "${REPVAR_SANITIZE}")
  target_compile_options(repvar_sanitize INTERFACE -fsanitize=${_repvar_san} -fno-omit-frame-pointer)
  target_link_options(repvar_sanitize INTERFACE -fsanitize=${_repvar_san})
endif()

# Sources include each other as "common/tensor/tensor.h", "server/core/...":
# the source tree is an include root of every target of ours, but PRIVATE, so
# it never leaks into what a target exports (repvar_client exports only
# client/include and common/include). Which target may include which is
# checked by tools/check_layers.py (the `Layering` test) against the link
# graph recorded below.
add_library(repvar_tree INTERFACE)
target_include_directories(repvar_tree INTERFACE ${PROJECT_SOURCE_DIR})

# repvar_add_library(name [STATIC|INTERFACE] SOURCES...): a library of ours
# with warnings and sanitizers; headers are listed among its sources so that
# every header belongs to a target.
function(repvar_add_library name)
  add_library(${name} ${ARGN})
  get_target_property(_type ${name} TYPE)
  if(_type STREQUAL "INTERFACE_LIBRARY")
    target_link_libraries(${name} INTERFACE repvar_sanitize)
  else()
    target_link_libraries(${name} PRIVATE repvar_warnings repvar_tree PUBLIC repvar_sanitize)
    set_target_properties(${name} PROPERTIES POSITION_INDEPENDENT_CODE ON)
  endif()
  set_property(GLOBAL APPEND PROPERTY REPVAR_LAYER_TARGETS ${name})
endfunction()

function(repvar_add_executable name)
  add_executable(${name} ${ARGN})
  target_link_libraries(${name} PRIVATE repvar_warnings repvar_sanitize repvar_tree)
  set_property(GLOBAL APPEND PROPERTY REPVAR_LAYER_TARGETS ${name})
endfunction()

# Writes ${CMAKE_BINARY_DIR}/layers.json: every target of ours with its
# source directory, sources and direct link dependencies, for the layering
# check. Call once, at the end of the top-level CMakeLists.txt.
function(repvar_write_layer_map)
  get_property(_targets GLOBAL PROPERTY REPVAR_LAYER_TARGETS)
  set(_json "[\n")
  set(_sep "")
  foreach(t IN LISTS _targets)
    get_target_property(_dir ${t} SOURCE_DIR)
    get_target_property(_type ${t} TYPE)
    if(_type STREQUAL "INTERFACE_LIBRARY")
      set(_links "$<TARGET_PROPERTY:${t},INTERFACE_LINK_LIBRARIES>")
    else()
      set(_links "$<TARGET_PROPERTY:${t},LINK_LIBRARIES>")
    endif()
    string(APPEND _json "${_sep}{\"name\": \"${t}\", \"type\": \"${_type}\", \"dir\": \"${_dir}\", "
           "\"sources\": \"$<JOIN:$<TARGET_PROPERTY:${t},SOURCES>,;>\", "
           "\"links\": \"$<JOIN:${_links},;>\"}")
    set(_sep ",\n")
  endforeach()
  string(APPEND _json "\n]\n")
  file(GENERATE OUTPUT ${CMAKE_BINARY_DIR}/layers.json CONTENT "${_json}")
endfunction()
