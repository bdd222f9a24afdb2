# cmake -DNM=nm -DOBJECT_LIST=file [-DSOURCES_DIR=dir] -P LoomHeaderSymbols.cmake
#
# Reads the symbols of each header-check object (one public header per
# object) and fails, naming the header and the symbol, when one defines a
# strong global symbol: a function or variable defined in a header without
# `inline` (or template, or constexpr), which two translation units of one
# program including the header would define twice. Inline functions,
# template instantiations and inline variables are weak (W, V) or unique
# (u) symbols; constexpr variables have internal linkage and none at all.
if(NOT NM OR NOT OBJECT_LIST)
  message(FATAL_ERROR "LoomHeaderSymbols.cmake needs -DNM=<nm> and -DOBJECT_LIST=<file>")
endif()
file(STRINGS "${OBJECT_LIST}" objects)
list(LENGTH objects count)
if(count EQUAL 0)
  message(FATAL_ERROR "${OBJECT_LIST} names no objects: the header check compiled nothing")
endif()
set(offenders "")
foreach(object IN LISTS objects)
  if(NOT EXISTS "${object}")
    message(FATAL_ERROR "header-check object ${object} does not exist")
  endif()
  execute_process(COMMAND "${NM}" --defined-only --extern-only --demangle "${object}"
                  OUTPUT_VARIABLE symbols RESULT_VARIABLE status ERROR_VARIABLE errors)
  if(NOT status EQUAL 0)
    message(FATAL_ERROR "${NM} could not read ${object}: ${errors}")
  endif()
  string(REPLACE "\n" ";" lines "${symbols}")
  foreach(line IN LISTS lines)
    # "<address> <type> <name>": strong types are the upper-case letters
    # other than W and V (weak) and U (undefined, which --defined-only omits).
    if(line MATCHES "^[0-9a-fA-F]* ([A-TX-Z]) (.*)$")
      set(type "${CMAKE_MATCH_1}")
      set(name "${CMAKE_MATCH_2}")
      get_filename_component(stem "${object}" NAME)
      string(REGEX REPLACE "\\.(cpp|cu)\\.o(bj)?$" "" stem "${stem}")
      # The header, read back from the generated source's first line.
      set(header "${stem}")
      foreach(ext cpp cu)
        if(SOURCES_DIR AND EXISTS "${SOURCES_DIR}/${stem}.${ext}")
          file(STRINGS "${SOURCES_DIR}/${stem}.${ext}" first LIMIT_COUNT 1 REGEX "^#include <")
          string(REGEX REPLACE "^#include <([^>]*)>.*$" "\\1" header "${first}")
        endif()
      endforeach()
      list(APPEND offenders "${header}: ${name} (${type})")
    endif()
  endforeach()
endforeach()
if(offenders)
  list(JOIN offenders "\n  " text)
  message(FATAL_ERROR "a public header defines a non-inline symbol (make it inline, a template or constexpr):\n  ${text}")
endif()
message(STATUS "loom: ${count} header objects define no strong symbol")
