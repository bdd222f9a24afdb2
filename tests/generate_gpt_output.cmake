# Shared by the generate_gpt ctest scripts: runs generate_gpt with the
# caller's ${model} flags and more, and keeps what it printed.
# generate(<var> <flags...>): the completions a run printed (without the
# summary line, whose time differs from run to run), into <var>.
function(generate result)
  execute_process(COMMAND "${GENERATE_GPT}" ${model} ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "generate_gpt ${ARGN} failed (${rc}):\n${out}\n${err}")
  endif()
  string(FIND "${out}" "--- completion 1:" begin)
  string(FIND "${out}" "\ngenerated " end REVERSE)
  if(begin EQUAL -1 OR end EQUAL -1)
    message(FATAL_ERROR "generate_gpt ${ARGN} printed no completions and summary:\n${out}")
  endif()
  math(EXPR length "${end} - ${begin}")
  string(SUBSTRING "${out}" ${begin} ${length} text)
  set(${result} "${text}" PARENT_SCOPE)
  set(${result}_output "${out}" PARENT_SCOPE)
endfunction()

