# run(<flags...>): runs ${TRAIN_GPT} with ${model} and the flags; a failure
# ends the script with the run's output. Included by the train_gpt_*.cmake
# scripts, which set TRAIN_GPT (the binary) and `model` (the shared flags).
# The run's standard output is left in `run_output` for the caller.
function(run)
  execute_process(COMMAND "${TRAIN_GPT}" ${model} ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "train_gpt ${ARGN} failed (${rc}):\n${out}\n${err}")
  endif()
  set(run_output "${out}" PARENT_SCOPE)
endfunction()

# final_loss(<output> <var>): the "final loss X after N steps" a run printed, into <var>.
function(final_loss output result)
  if(NOT output MATCHES "final loss ([0-9.]+) after [0-9]+ steps")
    message(FATAL_ERROR "no final loss in:\n${output}")
  endif()
  set(${result} "${CMAKE_MATCH_1}" PARENT_SCOPE)
endfunction()
