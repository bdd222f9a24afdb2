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
    // A sharded --save is a directory: made now, and its index probed.
    const std::string saved_file = flags.sharded ? (std::filesystem::path(flags.save) / "index.json").string() : flags.save;
    const std::array<std::pair<const char*, const std::string*>, 2> outputs{{{"--save", &saved_file}, {"--trace", &flags.trace}}};
    for (const auto& [flag, path] : outputs) {
        if (path->empty()) continue;
        try {
            std::error_code made;
            if (flags.sharded && path == &saved_file) std::filesystem::create_directories(flags.save, made);
            LOOM_CHECK(!made, "cannot create the directory: ", made.message());
            loom::io::probe_writable(*path);
        } catch (const loom::Error& e) {
            throw loom::Error("train_gpt: " + std::string(flag) + " " + (path == &saved_file ? flags.save : *path) +
                              " cannot be written (checked before training): " + e.message());
        }
    }
    if (!flags.save.empty())
        for (const auto& stale : loom::io::remove_stale_temporaries(saved_file))
            std::printf("removed %s, a temporary file left by a run that was killed\n", stale.string().c_str());
    if (!flags.resume.empty()) {
        const std::string note =
            std::filesystem::is_directory(flags.resume)
                ? loom::train::check_run_identity(loom::exec::read_sharded_index(flags.resume).metadata, flags.resume,
                                                  flags.data, flags.seed, flags.resume_anyway, "--resume-anyway")
                : loom::train::check_run_identity(loom::io::SafetensorsFile(flags.resume).metadata(), flags.resume,
                                                  flags.data, flags.seed, flags.resume_anyway, "--resume-anyway");
        if (!note.empty()) std::printf("note: %s\n", note.c_str());
    }
}

// --sharded: finishes the save in flight (a collective: every rank reaches
// it at the same step), then starts this one, which writes while training
// goes on. A non-finite state throws on every rank at its finish, and the
// last good checkpoint stays.
// Each rank's compressor state rides in its own shard, under its signature.
template <loom::comm::Communicator C>
void save_sharded_state(C& world, const loom::exec::Executor<C>& exec, const Flags& flags, std::int64_t step,
                        const std::string& data, const std::string& compression_signature,
                        std::optional<loom::exec::ShardedSave<C>>& in_flight) {
    if (in_flight) {
        in_flight->finish();
        in_flight.reset();
    }
    auto metadata = loom::gpt::sharded_metadata(flags.model, step, exec.optimizer_steps(), data);
    metadata.merge(loom::train::run_identity_metadata(flags.data, flags.seed));
    loom::exec::RankState compressor;
    if (flags.compress().on()) {
        compressor = {compression_signature, std::vector<float>(static_cast<std::size_t>(exec.compression_state_size()))};
        exec.save_compression_state(compressor.values);
    }
    in_flight.emplace(exec, world, flags.save, std::move(metadata), std::move(compressor));
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
