# SPDX-License-Identifier: Apache-2.0
# `cmake --install` puts the daemons and repvarctl under a prefix, where they
# run without the build tree: --version answers from the installed copy.
# Run as: cmake -DBUILD=<build dir> -DPREFIX=<scratch dir> -P install_test.cmake
file(REMOVE_RECURSE ${PREFIX})
execute_process(COMMAND ${CMAKE_COMMAND} --install ${BUILD} --prefix ${PREFIX}
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "cmake --install failed (${rc}): ${out} ${err}")
endif()
foreach(daemon repvar-coordinator repvar-worker)
  set(bin ${PREFIX}/bin/${daemon})
  if(NOT EXISTS ${bin})
    message(FATAL_ERROR "${bin} was not installed")
  endif()
  execute_process(COMMAND ${bin} --version RESULT_VARIABLE rc OUTPUT_VARIABLE version
                  WORKING_DIRECTORY ${PREFIX})
  if(NOT rc EQUAL 0 OR NOT version MATCHES "^${daemon} [0-9]+\\.[0-9]+\\.[0-9]+ \\(commit ")
    message(FATAL_ERROR "${bin} --version: exit ${rc}, \"${version}\"")
  endif()
endforeach()
if(NOT EXISTS ${PREFIX}/bin/repvarctl)
  message(FATAL_ERROR "repvarctl was not installed")
endif()
file(REMOVE_RECURSE ${PREFIX})
message(STATUS "installed and ran from ${PREFIX}")
