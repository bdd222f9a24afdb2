# Fails if a folder includes one that sits above it in docs/design.md's
# layers: here, the cycle that once ran between plan/ and exec/ (the planner
# includes the executor's programs; nothing below the planner includes it).
cmake_minimum_required(VERSION 3.20)
file(GLOB_RECURSE headers RELATIVE "${LOOM_INCLUDE_DIR}" "${LOOM_INCLUDE_DIR}/loom/*.hpp" "${LOOM_INCLUDE_DIR}/loom/*.cuh")
set(below_plan core comm kernels nn optim parallel schedule exec io data gpt)
set(bad "")
set(checked 0)
foreach(header IN LISTS headers)
  string(REGEX MATCH "^loom/([a-z_]+)/" _ "${header}")
  set(folder "${CMAKE_MATCH_1}")
  if(NOT folder IN_LIST below_plan)
    continue()
  endif()
  math(EXPR checked "${checked} + 1")
  file(STRINGS "${LOOM_INCLUDE_DIR}/${header}" includes REGEX "^[ \t]*#[ \t]*include[ \t]*[<\"]loom/plan/")
  foreach(line IN LISTS includes)
    list(APPEND bad "${header}: ${line}")
  endforeach()
endforeach()
include("${CMAKE_CURRENT_LIST_DIR}/include_rule_report.cmake")
loom_include_rule_verdict("${checked}" "${bad}" "headers below plan/ include the planner (move what they need below it)"
  "headers below plan/ include nothing from plan/")
