// How a front end names a run's settings in the library's messages. The
// library words a refusal with each setting's own name ("pp", "partition",
// "compress_warmup", "save_every": train::GptTraining's fields, and the few
// switches a front end adds beside them, such as "resume_anyway"); a command
// line passes a spelling that turns those names into its flags, a config
// file or a C++ caller keeps them as they are. So the library knows no
// command-line spellings, and each front end's messages name what its user
// wrote:
//
//   const SettingNames flags{[](std::string_view s) { return "--" + dashed(s); }};
//   train::settled_training(run, flags);   // "--save-every 5 needs --save FILE"
//   train::settled_training(run, {});      // "save_every 5 needs save FILE"
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <utility>

namespace loom {

class SettingNames {
public:
    SettingNames() = default;
    explicit SettingNames(std::function<std::string(std::string_view)> spell) : spell_(std::move(spell)) {}

    // How messages name `setting`: the front end's spelling, or the name itself.
    [[nodiscard]] std::string operator()(std::string_view setting) const {
        return spell_ ? spell_(setting) : std::string(setting);
    }

private:
    std::function<std::string(std::string_view)> spell_;
};

}  // namespace loom
