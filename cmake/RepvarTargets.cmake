# SPDX-License-Identifier: Apache-2.0
# Warnings, sanitizers and the C++ standard in one place.

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

# repvar_add_library(name SOURCES...): a library of ours with warnings and sanitizers.
function(repvar_add_library name)
  add_library(${name} ${ARGN})
  target_link_libraries(${name} PRIVATE repvar_warnings PUBLIC repvar_sanitize)
endfunction()

function(repvar_add_executable name)
  add_executable(${name} ${ARGN})
  target_link_libraries(${name} PRIVATE repvar_warnings repvar_sanitize)
endfunction()
