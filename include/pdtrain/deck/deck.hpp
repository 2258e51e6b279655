#pragma once
// The validated, typed form of an input deck. deck/ is the only part that reads TOML; every
// other part receives these structs. All fields carry their defaults here and in
// docs/deck.md; the schema in src/deck/schema.cpp is the single source of truth for names,
// types, ranges and documentation.
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "pdtrain/core/run_modes.hpp"

namespace pdtrain {

struct RunConfig {
  std::string name = "default";
  std::int64_t seed = 1337;
  std::int64_t steps = 200;
  std::string out_dir;  // empty in the deck means "runs/<name>"; resolved by parse_deck
  std::int64_t log_every = 1;

  friend bool operator==(const RunConfig&, const RunConfig&) = default;
};

struct ModelConfig {
  std::int64_t n_layer = 2;
  std::int64_t n_head = 4;
  std::int64_t d_model = 64;
  std::int64_t vocab_size = 64;
  std::int64_t padded_vocab_size = 0;  // 0: vocab_size rounded up to a multiple of 128 (llm.c)
  std::int64_t seq_len = 64;
  std::int64_t max_seq_len = 0;  // rows of the position table; 0: seq_len
  double init_std = 0.02;
  std::string init{};  // "": random (init_std); "llmc:PATH": llm.c file; "hf:DIR": Hugging Face

  friend bool operator==(const ModelConfig&, const ModelConfig&) = default;
};

struct DataConfig {
  std::string source = "synthetic";  // synthetic | text | tokens
  std::string path;                  // required for text and tokens
  std::string val_path;              // optional held-out file; else the tail of `path`
  double val_fraction = 0.1;         // tail share of `path` held out when val_path is empty
  std::int64_t copy_lag = 8;         // synthetic: distance of the copied token
  double copy_prob = 0.75;           // synthetic: probability a token copies lag back

  friend bool operator==(const DataConfig&, const DataConfig&) = default;
};

struct ParallelConfig {
  std::int64_t holders = 1;  // 0: the replicated baseline
  std::int64_t dp = 0;       // 0: all compute ranks the world leaves after holders / (tp*pp)
  std::int64_t tp = 1;
  std::int64_t pp = 1;
  std::int64_t micro_batches = 1;  // per replica and step; the pipeline fills with these
  std::string schedule = "1f1b";   // pipeline schedule: 1f1b | gpipe
  StageOrder order = StageOrder::micro_batch;  // one stage: each unit once per pass
  std::string comm = "auto";  // compute-to-compute transport: auto | mpi | nccl
  double nccl_timeout_s = 600.0;  // NCCL watchdog: no progress this long ends the job; 0: off

  friend bool operator==(const ParallelConfig&, const ParallelConfig&) = default;
};

struct TrainConfig {
  std::int64_t batch_size = 8;     // sequences per optimizer step, global
  std::int64_t eval_every = 50;    // validation every N steps (and at the end); 0: end only
  std::int64_t sample_every = 0;   // > 0: print a short sample of the model every N steps
  std::int64_t eval_batches = 4;   // validation batches of batch_size sequences
  std::string recompute = "none";  // none | attention | full (activation recomputation)
  Precision precision = Precision::fp32;  // bf16: bf16 matmuls, fp32 master weights
  // The divergence guard (a loss or gradient norm that is not finite): stop (exit status 5),
  // or rewind to the last checkpoint before it with a lower learning rate, skipping its batch.
  std::string on_divergence = "stop";  // stop | rewind
  double rewind_lr_factor = 0.5;       // each rewind multiplies optimizer.lr and min_lr by this
  std::int64_t max_rewinds = 3;        // rewinds per run before a divergence stops it
  double loss_spike_factor = 0.0;      // > 0: a loss above this x the running median diverges
  std::int64_t loss_spike_window = 20; // steps in that running median

  friend bool operator==(const TrainConfig&, const TrainConfig&) = default;
};

struct ComputeConfig {
  std::string device = "cpu";  // cpu | cuda: where compute ranks run the model
  bool tf32 = false;           // cuda: fp32 matmuls on TF32 tensor cores (faster, ~10 bits)
  std::string attention = "auto";  // cuda: auto | cudnn | pdtrain (the attention family)
  friend bool operator==(const ComputeConfig&, const ComputeConfig&) = default;
};

struct OptimizerConfig {
  double lr = 3e-3;
  double min_lr = 3e-4;            // cosine decays to this at run.steps
  std::int64_t warmup_steps = 20;
  double weight_decay = 0.1;       // decoupled, matrices only (not LayerNorm, not biases)
  double grad_clip = 1.0;          // global-norm clip; 0 disables
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;

  friend bool operator==(const OptimizerConfig&, const OptimizerConfig&) = default;
};

struct PdConfig {
  std::string fetch_codec = "raw";  // raw | bf16 | lz4 (bf16 is lossy)
  std::string push_codec = "raw";   // raw | bf16 | zstd (bf16 is lossy)
  std::int64_t staleness = 0;       // 0: synchronous; s: step k uses version >= k-1-s
  std::int64_t staleness_warmup = 200;  // steps 1..N synchronous before the delay starts
  std::int64_t staleness_ramp = 100;    // then steps per unit of delay until pd.staleness
  std::string stale_correction = "trend";  // none | predict | trend (serve extrapolated versions)
  std::int64_t prefetch_depth = 64; // uses (layers) fetched ahead, as far as pd.cache_mb allows
  double cache_mb = 0.0;            // parameter bytes resident per compute rank; 0: no limit
  std::int64_t cache_warm_steps = 0;  // cold start: no limit for the first N steps' versions
  bool fetch_thread = false;        // a background thread moves fetches (MPI_THREAD_MULTIPLE)
  std::string fetch_path = "auto";  // auto (shared memory on a holder's node) | mpi
  std::int64_t holder_threads = 0;  // threads of a holder's update; 0: the cores it may run on
  std::int64_t pushes_in_flight = 1;  // units' gradients on the wire while backward goes on
  friend bool operator==(const PdConfig&, const PdConfig&) = default;
};

struct CheckpointConfig {
  std::int64_t every = 0;        // checkpoint every N steps; 0: only at the end of the run
  std::string codec = "zstd";    // raw | zstd | xor | bitdelta (lossy)
  std::int64_t anchor_every = 4; // delta codecs: a full anchor every N checkpoints
  std::int64_t bitdelta_bits = 4;  // bitdelta: bits per parameter of the delta to the anchor
  std::int64_t moment_bits = 6;    // bitdelta: bits per Adam m and v value; 0: lossless xor
  std::int64_t keep = 3;         // newest checkpoints kept (plus anchors they need); 0: all
  bool async = false;            // encode in the background while training continues
  std::string dir;               // empty: <run.out_dir>/checkpoints
  friend bool operator==(const CheckpointConfig&, const CheckpointConfig&) = default;
};

struct OutputConfig {
  bool trace = false;  // Chrome trace JSON per rank (OUT/trace/rank-<r>.json) and merged
  std::int64_t trajectory_every = 0;  // > 0: per-tensor norms every N steps (OUT/trajectories.csv)
  friend bool operator==(const OutputConfig&, const OutputConfig&) = default;
};

struct Deck {
  RunConfig run;
  ModelConfig model;
  DataConfig data;
  ParallelConfig parallel;
  TrainConfig train;
  ComputeConfig compute;
  OptimizerConfig optimizer;
  PdConfig pd;
  CheckpointConfig checkpoint;
  OutputConfig output;

  std::string source_name;   // deck file path, or "<default deck>"
  std::string source_text;   // the deck text as read (before --set)
  // Where each key was set: "deck.toml:12", "--set", or "default". Used by later checks
  // (layout, data) to name the line that caused an error.
  std::map<std::string, std::string> origin;

  // "FILE:LINE: key" (or "--set key" / "default value of key") for messages.
  std::string where(const std::string& dotted_key) const;
  // The fully resolved deck as TOML text (every key, defaults included).
  std::string resolved_toml() const;
};

// Parses and validates a deck. `text` is the TOML, `source_name` names it in messages.
// `overrides` are "section.key=value" strings from --set, applied after the file and checked
// the same way. Throws pdtrain::Error(ExitCode::deck, message) on any problem; the message
// names the file, line and key and, for unknown keys, suggests the nearest valid key.
Deck parse_deck(const std::string& text, const std::string& source_name,
                const std::vector<std::string>& overrides);

// The rules between keys (parse_deck checks them), checked again for a deck whose values were
// completed after parsing (model.init's shape, app/model_init). Error(ExitCode::deck).
void check_deck_rules(const Deck& deck);

// The text of a deck file; Error(ExitCode::deck) naming it when unreadable.
std::string read_deck_text(const std::string& path);

// Reads the file (Error(ExitCode::deck) naming it when unreadable) and calls parse_deck.
Deck load_deck(const std::string& path, const std::vector<std::string>& overrides);

// The embedded default deck (input/default.toml compiled in), and its name in messages and
// origins ("<default deck>:12").
const char* default_deck_text();
inline constexpr const char* kDefaultDeckName = "<default deck>";

// True when two decks configure the same run: every key equal, origins and source ignored.
bool same_settings(const Deck& a, const Deck& b);

// Markdown reference of every key (type, default, range, meaning), generated from the schema.
std::string deck_reference_markdown();

}  // namespace pdtrain
