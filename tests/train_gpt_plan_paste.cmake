# The plan loom-plan prints can be pasted back: its "train_gpt ..." line
# (degrees, then --strategy '<the spec's text>') runs as it stands, and
# train_gpt prints the very strategy loom-plan named. Run with
# -DLOOM_PLAN=<binary> -DTRAIN_GPT=<binary> -DCLUSTER=<cluster file>.
execute_process(COMMAND "${LOOM_PLAN}" --gpt 4,64,4,32,256 --batch 8 --cluster "${CLUSTER}" --top 1
                OUTPUT_VARIABLE plan ERROR_VARIABLE plan_error RESULT_VARIABLE plan_result)
if(NOT plan_result EQUAL 0)
  message(FATAL_ERROR "loom-plan failed: ${plan_error}")
endif()
if(NOT plan MATCHES "\n     (Strategy<[^\n]*>)\n     train_gpt ([^\n]*)")
  message(FATAL_ERROR "no strategy and train_gpt line in loom-plan's output:\n${plan}")
endif()
set(strategy "${CMAKE_MATCH_1}")
set(line "${CMAKE_MATCH_2}")
if(NOT line MATCHES "--strategy '")
  message(FATAL_ERROR "loom-plan's train_gpt line does not give --strategy: ${line}")
endif()
# Through a shell, as a user pastes it (the quotes keep the strategy one word).
execute_process(COMMAND sh -c "\"${TRAIN_GPT}\" ${line} --steps 1"
                OUTPUT_VARIABLE run ERROR_VARIABLE run_error RESULT_VARIABLE run_result)
if(NOT run_result EQUAL 0)
  message(FATAL_ERROR "train_gpt ${line} failed: ${run_error}")
endif()
string(FIND "${run}" "${strategy} on " at)
if(at LESS 0)
  message(FATAL_ERROR "train_gpt did not run loom-plan's ${strategy}:\n${run}")
endif()
message(STATUS "pasted and ran: train_gpt ${line}")
