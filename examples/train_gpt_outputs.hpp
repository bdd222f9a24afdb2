// What train_gpt writes and when, so that nothing is lost: the outputs are
// probed before anything is built (a bad --save or --trace fails in one line,
// not after hours of training), a resume is checked to continue the same run
// (data and seed, train/data_identity.hpp), and every save, periodic or
// final, first checks the state is finite, so a diverged run never replaces
// the last good checkpoint. Included by train_gpt.cpp inside its anonymous
// namespace, after train_gpt_flags.hpp.
#pragma once

// Before any rank starts: the files the run will write can be written, the
// temporaries a crashed run left beside --save are removed, and --resume
// continues this run's data and seed (or --resume-anyway says go on).
inline void check_outputs_and_resume(const Flags& flags) {
    const std::array<std::pair<const char*, const std::string*>, 2> outputs{{{"--save", &flags.save}, {"--trace", &flags.trace}}};
    for (const auto& [flag, path] : outputs) {
        if (path->empty()) continue;
        try {
            loom::io::probe_writable(*path);
        } catch (const loom::Error& e) {
            throw loom::Error("train_gpt: " + std::string(flag) + " " + *path + " cannot be written (checked before training): " +
                              e.message());
        }
    }
    if (!flags.save.empty())
        for (const auto& stale : loom::io::remove_stale_temporaries(flags.save))
            std::printf("removed %s, a temporary file left by a run that was killed\n", stale.string().c_str());
    if (!flags.resume.empty()) {
        const loom::io::SafetensorsFile checkpoint(flags.resume);
        const std::string note = loom::train::check_run_identity(checkpoint.metadata(), flags.resume, flags.data, flags.seed,
                                                                 flags.resume_anyway, "--resume-anyway");
        if (!note.empty()) std::printf("note: %s\n", note.c_str());
    }
}

// The whole model on every rank (a collective), checked finite and, if
// `path` is given, saved by the lead rank with each rank's compressor state
// (collective too), the data's identity and the seed. Returns the values (for --sample).
template <loom::comm::Communicator C, class Exec>
std::vector<float> save_state(C& world, Exec& exec, const Flags& flags, const std::string& path, std::int64_t step,
                              const std::string& compression_signature, const std::string& data) {
    const auto parameters = static_cast<std::size_t>(exec.parameter_count());
    std::vector<float> values(parameters), m(parameters), v(parameters);
    exec.gather_state(values, m, v);
    if (path.empty()) return values;
    // Every rank holds the same gathered state, so all throw together.
    loom::gpt::check_finite_state(flags.model, values, m, v,
                                  "step " + std::to_string(step) + " (" + path + " was not written)");
    std::vector<loom::Buffer<loom::Host>> storage;
    std::vector<loom::io::NamedTensor> extra;
    std::map<std::string, std::string> metadata = loom::train::run_identity_metadata(flags.data, flags.seed);
    if (flags.compress().on()) {
        std::vector<float> state(static_cast<std::size_t>(exec.compression_state_size()));
        exec.save_compression_state(state);
        extra = loom::train::gather_compression_states(world, state, storage);
        metadata[loom::train::compression_metadata_key] = compression_signature;
    }
    if (world.rank() == 0)
        loom::gpt::save_checkpoint(path, flags.model, values, m, v, exec.optimizer_steps(), step, data, extra, metadata);
    return values;
}

// After a stop signal: where the run stands and how to go on.
inline void report_stop(const Flags& flags, std::int64_t done) {
    std::printf("train_gpt: %s: stopped after step %lld of %lld; %s\n", loom::train::StopSignal::name().c_str(),
                static_cast<long long>(done), static_cast<long long>(flags.until),
                flags.save.empty() ? "no --save, so these steps are not kept"
                                   : ("continue with --resume " + flags.save).c_str());
}
