// train_gpt --optex N: OptEx<AdamW> over N workers (optim/optex.hpp), its
// own training loop beside the executor's. Its state, history and
// collectives stay in host memory over a host communicator (rank threads, or
// MPI processes); each rank's forward and backward run where --device says
// (train::OptExGradient). Included by train_gpt.cpp inside its anonymous
// namespace, after its Flags, step_loop and print helpers; train_gpt.cpp
// includes the loom headers this uses at its top.
#pragma once

// --optex N: OptEx<AdamW> on an optex axis of N workers, each a group of
// --dp ranks that averages its worker's gradient. Worker k of iteration t
// reads batch t N + k, so --optex 1 is plain AdamW on the same batches.
// OptEx's state, history and collectives stay in host memory (`world` is a
// host communicator); each rank's forward and backward run on `device`, a
// GPU with --device cuda.
void train_optex(loom::comm::AnyComm& world, const Flags& flags, const char* transport, loom::Device device) {
    using C = loom::comm::AnyComm;
    const int workers = flags.optex;
    const int dp_size = optex_dp_size(flags, world.size());
    loom::kernels::host::set_blas_threads(flags.threads);
    const bool lead = world.rank() == 0;
    const loom::data::ByteCorpus corpus = load_corpus(flags);
    loom::comm::Mesh<C> mesh(world, {{"optex", workers}, {"dp", dp_size}});
    C& dp = mesh.axis("dp");
    const int worker = mesh.coordinate("optex");

    loom::gpt::Model model = loom::gpt::make_model(flags.model);
    loom::train::OptExGradient<loom::gpt::Model, C> gradient_at(
        model, dp, flags.strategy,
        {.field_names = {"embed", "blocks", "ln_f", "head", "loss"}, .device = device, .matmul = flags.matmul});
    const std::int64_t parameters = gradient_at.size();
    std::vector<float> values(static_cast<std::size_t>(parameters));
    if (flags.resume.empty()) gradient_at.initial_values(flags.seed, values);
    const loom::optim::AdamWConfig adamw{flags.lr, 0.9f, 0.95f, 1e-8f, 0.1f};
    loom::optim::OptEx<loom::optim::AdamW, C> optex(
        mesh.axis("optex"), values, [&](std::int64_t n) { return loom::optim::AdamW(n, adamw); }, flags.optex_config);
    // A sharded resume reads this rank's slice of everything, the history
    // included, from any number of workers (or the executor's shards, with
    // no history); one file keeps no history.
    std::string history_note;  // why a resume starts with an empty history
    const std::int64_t first_step =
        flags.resume.empty() ? 0 : loom::train::resume_optex(optex, flags.model, flags.resume, history_note);

    if (lead) {
        std::ostringstream config, method;
        config << flags.model;
        method << flags.optex_config;
        std::printf("%s, %lld parameters, batch %lld x %lld tokens per worker, %s\n", config.str().c_str(),
                    static_cast<long long>(parameters), static_cast<long long>(flags.batch),
                    static_cast<long long>(flags.model.seq), corpus.describe().c_str());
        method << "<AdamW>";
        if (flags.strategy.recompute.on()) method << ", Recompute<" << flags.strategy.recompute.describe() << ">";
        std::printf("%s on %d %s (optex %d x dp %d), each rank holding 1/%d of the state and history\n",
                    method.str().c_str(), world.size(), transport, workers, dp_size, workers);
        print_matmul_precision(flags);
        if (!flags.resume.empty())
            std::printf("resumed from %s at step %lld%s%s\n", flags.resume.c_str(), static_cast<long long>(first_step),
                        history_note.empty() ? " with OptEx's history" : "; OptEx's history starts empty: ",
                        history_note.c_str());
    }

    // Saves: --sharded writes each rank's slice, history included, in the
    // background (finished at the next save, a collective); one file is the
    // whole state gathered to every rank and written by the lead.
    const bool holder = mesh.coordinate("dp") == 0;  // the other dp replicas hold copies
    std::optional<loom::exec::ShardedSave<C>> in_flight;
    const auto identity = loom::train::run_identity_metadata(flags.data, flags.seed);  // for a resume to check
    const auto save = [&](const std::string& path, std::int64_t step) {
        if (flags.sharded)
            loom::train::save_optex_sharded(world, optex, holder, flags.model, path, step, corpus.describe(), identity,
                                            in_flight);
        else
            loom::train::save_optex(world, optex, flags.model, path, step, corpus.describe(), identity);
    };

    const std::int64_t rows = flags.batch / dp_size, T = flags.model.seq, total = flags.steps, last = flags.until;
    std::vector<std::int32_t> inputs(static_cast<std::size_t>(rows * T)), targets(inputs.size());
    double length_scale = flags.optex_config.estimator.length_scale;
    std::int64_t skipped = 0;
    const auto [done, loss] = loom::train::run_steps(
        world, step_loop(flags, first_step, workers * flags.batch * T, loom::host_device),
        [&](std::int64_t step) {
            optex.set_lr(loom::optim::cosine_lr(step + 1, total, flags.lr, std::min<std::int64_t>(20, total / 10)));
            const auto result = optex.iterate([&](std::span<const float> x, std::span<float> g) {
                corpus.rows(flags.seed, step * workers + worker, mesh.coordinate("dp") * rows, rows, T, inputs, targets);
                return gradient_at(x, loom::Tensor::of(inputs.data(), {rows, T}),
                                   loom::Tensor::of(targets.data(), {rows, T}), g);
            });
            skipped += result.skipped;
            if (lead && result.length_scale != length_scale)
                std::printf("\nOptEx: length scale tuned to %g at step %lld\n", result.length_scale,
                            static_cast<long long>(step));
            length_scale = result.length_scale;
            return result.loss;
        },
        save);
    if (lead && done > first_step) {
        std::printf("final loss %.4f after %lld steps\n", static_cast<double>(loss), static_cast<long long>(done));
        std::printf("OptEx: %lld sequential iterations, %lld gradients, %lld not finite (kept out of the history)\n",
                    static_cast<long long>(done - first_step), static_cast<long long>((done - first_step) * workers),
                    static_cast<long long>(skipped));
    }
    if (!flags.save.empty()) {
        save(flags.save, done);
        if (in_flight) in_flight->finish();
        if (lead)
            std::printf("saved %s (step %lld%s)\n", flags.save.c_str(), static_cast<long long>(done),
                        flags.sharded ? ", one shard per rank, with OptEx's history" : "");
    }
    if (flags.sample > 0 && done == last) {
        optex.gather_params(values);  // a collective
        if (lead) print_sample(flags, corpus, values);
    }
    if (lead && done < last) report_stop(flags, done);
}
