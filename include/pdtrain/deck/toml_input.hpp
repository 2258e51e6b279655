#pragma once
// TOML text read safely, for decks and the project's other TOML inputs (the machine files of
// `pdtrain plan`): deck/ is the only parser of TOML text, so every such file gets the same
// bounds (size, nesting) and the same FILE:LINE syntax errors.
#include <string>
#include <toml.hpp>

namespace pdtrain::deck {

// The text of `path`, at most kMaxDeckBytes. `kind` names the file in errors ("deck",
// "machine": "cannot read machine file ..."); every error is Error(ExitCode::deck).
std::string read_toml_text(const std::string& path, const char* kind);

// `text` parsed, its nesting bounded first (toml11 recurses per level). Errors name FILE:LINE;
// `kind` is what the file is ("deck", "machine file").
toml::value parse_toml(const std::string& text, const std::string& file, const char* kind);

}  // namespace pdtrain::deck
