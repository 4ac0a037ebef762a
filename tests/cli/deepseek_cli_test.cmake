# `specula generate` on a tiny DeepSeek checkpoint (MLA, dense MLP): written by WRITER into DIR,
# then generated from with the bf16 and the fp8_ds_mla latent caches; EAGLE on it is one clear
# error. The numbers themselves are checked by model_test's float64 reference.
execute_process(COMMAND ${WRITER} ${DIR} RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "write_tiny_deepseek failed: rc=${rc}")
endif()
foreach(dtype bf16 fp8_e4m3)
  execute_process(COMMAND ${SPECULA} generate --model ${DIR} --prompt "Latent" --max-new-tokens 6 --ignore-eos
                  --kv-cache-dtype ${dtype} --page-size 64 --json OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0 OR NOT out MATCHES "\"output_ids\":\\[[0-9]+,[0-9]+,[0-9]+,[0-9]+,[0-9]+,[0-9]+\\]")
    message(FATAL_ERROR "generate on DeepSeek with ${dtype}: rc=${rc} output='${out}' stderr='${err}'")
  endif()
endforeach()
execute_process(COMMAND ${SPECULA} generate --model ${DIR} --prompt "Latent" --kv-cache-dtype f16
                ERROR_VARIABLE err RESULT_VARIABLE rc)
if(rc EQUAL 0 OR NOT err MATCHES "use bf16 or fp8_e4m3")
  message(FATAL_ERROR "generate on DeepSeek with an f16 cache: rc=${rc} stderr='${err}'")
endif()
execute_process(COMMAND ${SPECULA} generate --model ${DIR} --prompt "Latent" --speculative-algorithm EAGLE
                --draft-model ${DIR} ERROR_VARIABLE err RESULT_VARIABLE rc)
if(rc EQUAL 0 OR NOT err MATCHES "needs a Llama-family target")
  message(FATAL_ERROR "EAGLE on DeepSeek: rc=${rc} stderr='${err}'")
endif()
execute_process(COMMAND ${SPECULA} generate --model ${DIR} --prompt "Latent" --fp8-expert-weights f16
                ERROR_VARIABLE err RESULT_VARIABLE rc)
if(rc EQUAL 0 OR NOT err MATCHES "--fp8-expert-weights f16: allowed bf16, fp8")
  message(FATAL_ERROR "generate with --fp8-expert-weights f16: rc=${rc} stderr='${err}'")
endif()
