// train_gpt --device cuda[:N]: one rank trains the GPT on a GPU through
// exec::SerialTrainer, the layers' kernels running on the device through the
// backend that train_gpt_cuda.cu builds in (loom/cuda_backend.cuh). Same
// flags, data order, learning-rate schedule, checkpoints and samples as the
// host run with --dp 1: a checkpoint saved by either loads on the other.
// Included by train_gpt.cpp inside its anonymous namespace, after its Flags
// and RunReport; train_gpt.cpp includes the loom headers this uses
// (core/device_runtime.hpp, exec/serial_trainer.hpp) at its top.
#pragma once

// Flags the device path does not have yet: named, with why, before any work.
inline void check_device_flags(const Flags& flags) {
    if (flags.device.kind == loom::DeviceKind::host) return;
    std::ostringstream where;
    where << flags.device;
    const auto refuse = [&](bool given, const std::string& what) {
        if (given)
            usage_error("--device " + where.str() + " trains one rank so far (the executor's strategies run on the "
                        "host only); drop " + what + " or use --device host");
    };
    refuse(flags.dp > 1, "--dp " + std::to_string(flags.dp));
    refuse(flags.pp > 1, "--pp " + std::to_string(flags.pp));
    refuse(flags.tp > 1, "--tp " + std::to_string(flags.tp));
    refuse(flags.sp > 1, "--sp " + std::to_string(flags.sp));
    refuse(flags.zero > 0, "--zero " + std::to_string(flags.zero));
    refuse(flags.optex > 0, "--optex " + std::to_string(flags.optex));
    refuse(flags.compress.on(), "--compress " + flags.compress.describe());
    refuse(!flags.trace.empty(), "--trace (the trace is the executor's step program)");
    refuse(!flags.cluster.empty(), "--cluster");
}

inline void train_on_device(const Flags& flags) {
    std::ostringstream where;
    where << flags.device;
    try {
        loom::check_device_usable(flags.device);
    } catch (const loom::Error& e) {
        usage_error("--device " + where.str() + ": " + e.message());
    }
    const auto corpus = flags.data.empty()
                            ? loom::data::ByteCorpus::synthetic(std::int64_t{1} << 20, flags.seed, static_cast<int>(flags.model.vocab))
                            : loom::data::ByteCorpus::from_file(flags.data, static_cast<int>(flags.model.vocab));
    if (flags.batch % flags.micro_batches != 0)
        usage_error("--batch " + std::to_string(flags.batch) + " is not divisible by --micro-batches " +
                    std::to_string(flags.micro_batches));
    const std::int64_t T = flags.model.seq;
    {
        // A corpus too short for one sequence is refused before anything is built.
        std::vector<std::int32_t> probe(static_cast<std::size_t>(T)), probe_targets(probe.size());
        corpus.batch(flags.seed, 0, 1, T, probe, probe_targets);
    }
    std::vector<std::int32_t> inputs(static_cast<std::size_t>(flags.batch * T)), targets(inputs.size());

    loom::gpt::Model model = loom::gpt::make_model(flags.model);
    const loom::optim::AdamWConfig adamw{flags.lr, 0.9f, 0.95f, 1e-8f, 0.1f, std::max<std::int64_t>(0, flags.freeze_variance)};
    loom::exec::SerialTrainer trainer(model, flags.device, {.micro_batches = flags.micro_batches, .adamw = adamw});
    const auto parameters = trainer.parameter_count();
    std::int64_t first_step = 0;
    if (!flags.resume.empty()) {
        // Checkpoints are host arrays in the serial order, whoever wrote them.
        std::vector<float> values(static_cast<std::size_t>(parameters)), m(values.size()), v(values.size());
        const auto steps = loom::gpt::load_checkpoint(flags.resume, flags.model, values, m, v);
        trainer.load_state(values, m, v, steps.optimizer_steps);
        first_step = steps.step;
    } else {
        trainer.initialize(flags.seed);
    }

    std::ostringstream config;
    config << flags.model;
    std::printf("%s, %lld parameters, batch %lld x %lld tokens, %s\n", config.str().c_str(),
                static_cast<long long>(parameters), static_cast<long long>(flags.batch), static_cast<long long>(T),
                corpus.describe().c_str());
    std::printf("one rank on %s: %s, %d micro-batch%s\n", where.str().c_str(),
                loom::device_runtime(flags.device).describe(flags.device.index).c_str(), flags.micro_batches,
                flags.micro_batches == 1 ? "" : "es");
    if (first_step > 0) std::printf("resumed from %s at step %lld\n", flags.resume.c_str(), static_cast<long long>(first_step));

    const auto input_tensor = loom::Tensor::of(inputs.data(), {flags.batch, T});
    const auto target_tensor = loom::Tensor::of(targets.data(), {flags.batch, T});
    RunReport run_report(flags, /*lead=*/true, first_step);
    auto& [metrics, progress] = run_report;
    float loss = 0;
    for (std::int64_t step = first_step; step < flags.until; ++step) {
        const auto t0 = std::chrono::steady_clock::now();
        corpus.rows(flags.seed, step, 0, flags.batch, T, inputs, targets);
        const float lr = loom::optim::cosine_lr(step + 1, flags.steps, flags.lr, std::min<std::int64_t>(20, flags.steps / 10));
        loss = trainer.step(input_tensor, target_tensor, lr);  // waits for the device: the loss is read back
        const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        const double tokens_per_second = static_cast<double>(flags.batch * T) / seconds;
        if (progress) progress->update(step - first_step + 1, loss, tokens_per_second);
        if (metrics) metrics->write(step, loss, tokens_per_second);
    }
    if (progress) progress->finish();
    if (flags.until > first_step)
        std::printf("final loss %.4f after %lld steps\n", static_cast<double>(loss), static_cast<long long>(flags.until));
    std::printf("activation memory: %.1f MiB on %s\n", static_cast<double>(trainer.activation_bytes()) / (1 << 20),
                where.str().c_str());
    if (flags.save.empty() && flags.sample == 0) return;
    std::vector<float> values(static_cast<std::size_t>(parameters)), m(values.size()), v(values.size());
    trainer.gather_state(values, m, v);
    if (!flags.save.empty()) {
        loom::gpt::save_checkpoint(flags.save, flags.model, values, m, v, trainer.optimizer_steps(), flags.until,
                                   corpus.describe());
        std::printf("saved %s (step %lld)\n", flags.save.c_str(), static_cast<long long>(flags.until));
    }
    if (flags.sample > 0) {
        // Sampled on the host from a copy of the trained weights.
        loom::gpt::Model serial = loom::gpt::make_model(flags.model);
        loom::nn::ParamArena arena(serial);
        std::copy(values.begin(), values.end(), arena.values().begin());
        const std::string text = loom::gpt::sample(serial, flags.model, corpus.text().substr(0, 16), flags.sample, flags.seed);
        std::printf("sample:\n%s\n", text.c_str());
    }
}
