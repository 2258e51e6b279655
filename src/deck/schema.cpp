// The single table of deck keys, plus the small helpers every user of the table needs:
// value checks, TOML literals and "did you mean" suggestions.
#include "pdtrain/deck/schema.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <limits>
#include <type_traits>

namespace pdtrain::deck {
namespace {

template <class T>
constexpr KeyType type_of() {
  if constexpr (std::is_same_v<T, std::int64_t>) return KeyType::integer;
  else if constexpr (std::is_same_v<T, double>) return KeyType::floating;
  else if constexpr (std::is_same_v<T, bool>) return KeyType::boolean;
  else {
    static_assert(std::is_same_v<T, std::string>, "unsupported deck field type");
    return KeyType::string;
  }
}

// A key's section and name from its dotted form, and its documentation.
KeySpec named(std::string dotted, std::string doc) {
  KeySpec k;
  const auto dot = dotted.find('.');
  k.section = dotted.substr(0, dot);
  k.name = dotted.substr(dot + 1);
  k.key = std::move(dotted);
  k.doc = std::move(doc);
  return k;
}

// One key stored at deck.*section.*field; the type comes from the field itself so the table
// cannot disagree with deck.hpp.
template <class S, class T>
KeySpec key(S Deck::*section, T S::*field, std::string dotted, std::string doc) {
  KeySpec k = named(std::move(dotted), std::move(doc));
  k.type = type_of<T>();
  k.get = [section, field](const Deck& d) { return Value{(d.*section).*field}; };
  k.set = [section, field](Deck& d, const Value& v) { (d.*section).*field = std::get<T>(v); };
  return k;
}

// A key whose field is an enum, written in the deck as the name of its value (`names`, in the
// enum's order): the text is parsed once, here, and checked as a choice.
template <class S, class E>
KeySpec enum_key(S Deck::*section, E S::*field, std::string dotted, std::string doc,
                 std::vector<std::string> names) {
  KeySpec k = named(std::move(dotted), std::move(doc));
  k.one_of(names);
  k.get = [section, field, names](const Deck& d) {
    return Value{names[static_cast<std::size_t>((d.*section).*field)]};
  };
  k.set = [section, field, names](Deck& d, const Value& v) {
    const auto it = std::find(names.begin(), names.end(), std::get<std::string>(v));
    (d.*section).*field = static_cast<E>(it - names.begin());
  };
  return k;
}

// Upper bounds of integer keys, powers of two far above any real run, chosen so that every
// size derived from them (parameters, tokens, ranks) stays inside 64 bits before
// app/setup checks what a rank would need (core/checked_int).
constexpr double kMaxCount(int log2) { return static_cast<double>(std::int64_t{1} << log2); }

std::vector<KeySpec> build_schema() {
  using D = Deck;
  return {
      key(&D::run, &RunConfig::name, "run.name",
          "Name of the run; the output directory is runs/<name> unless run.out_dir is set.")
          .required(),
      key(&D::run, &RunConfig::seed, "run.seed",
          "Seed of every random stream (initialization, data order, synthetic data)."),
      key(&D::run, &RunConfig::steps, "run.steps", "Optimizer steps to train.").at_least(1)
          .at_most(kMaxCount(40)),
      key(&D::run, &RunConfig::out_dir, "run.out_dir",
          "Directory for logs, checkpoints and the resolved deck; empty: runs/<run.name>."),
      key(&D::run, &RunConfig::log_every, "run.log_every",
          "Log the training loss every N steps.")
          .at_least(1)
          .at_most(kMaxCount(40)),

      key(&D::model, &ModelConfig::n_layer, "model.n_layer", "Transformer blocks.").at_least(1)
          .at_most(kMaxCount(16)),
      key(&D::model, &ModelConfig::n_head, "model.n_head", "Attention heads per block.")
          .at_least(1)
          .at_most(kMaxCount(16)),
      key(&D::model, &ModelConfig::d_model, "model.d_model",
          "Width of the residual stream (embedding size).")
          .at_least(1)
          .at_most(kMaxCount(20))
          .with_rule("divisible by model.n_head"),
      key(&D::model, &ModelConfig::vocab_size, "model.vocab_size",
          "Number of token ids the data may use (0 .. vocab_size-1).")
          .at_least(2)
          .at_most(kMaxCount(24)),
      key(&D::model, &ModelConfig::padded_vocab_size, "model.padded_vocab_size",
          "Rows of the token embedding; 0: vocab_size rounded up to a multiple of 128.")
          .at_least(0)
          .at_most(kMaxCount(24))
          .with_rule("0 or >= model.vocab_size"),
      key(&D::model, &ModelConfig::seq_len, "model.seq_len",
          "Tokens per training sequence (context length).")
          .at_least(2)
          .at_most(kMaxCount(24)),
      key(&D::model, &ModelConfig::max_seq_len, "model.max_seq_len",
          "Rows of the position table; 0: model.seq_len.")
          .at_least(0)
          .at_most(kMaxCount(24))
          .with_rule("0 or >= model.seq_len"),
      key(&D::model, &ModelConfig::init_std, "model.init_std",
          "Standard deviation of the normal weight initialization.")
          .above(0),
      key(&D::model, &ModelConfig::init, "model.init",
          "Initial weights: empty for random (model.init_std), llmc:PATH for an llm.c GPT-2 "
          "checkpoint, or hf:DIR for a Hugging Face GPT-2 directory (config.json and "
          "model.safetensors, as save_pretrained writes them). The file is the model: model "
          "keys the deck leaves at their defaults take the file's values (model.seq_len at most "
          "its positions); a key the deck sets to another value is an error naming both.")
          .with_rule("empty, llmc:PATH or hf:DIR"),

      key(&D::data, &DataConfig::source, "data.source",
          "Training data: the built-in synthetic copy task, a text file, or a token file.")
          .one_of({"synthetic", "text", "tokens"}),
      key(&D::data, &DataConfig::path, "data.path",
          "File to train on; required when data.source is text or tokens.")
          .with_rule("required when data.source is text or tokens"),
      key(&D::data, &DataConfig::val_path, "data.val_path",
          "Optional held-out validation file; empty: the tail of data.path."),
      key(&D::data, &DataConfig::val_fraction, "data.val_fraction",
          "Share of data.path held out for validation when data.val_path is empty.")
          .above(0)
          .below(1),
      key(&D::data, &DataConfig::copy_lag, "data.copy_lag",
          "Synthetic data: distance back of the token that is copied.")
          .at_least(1)
          .at_most(kMaxCount(24))
          .with_rule("< model.seq_len when data.source is synthetic"),
      key(&D::data, &DataConfig::copy_prob, "data.copy_prob",
          "Synthetic data: probability that a token copies the one data.copy_lag back.")
          .at_least(0)
          .at_most(1),

      key(&D::parallel, &ParallelConfig::holders, "parallel.holders",
          "Parameter-holder ranks; 0: the replicated baseline (each rank keeps its stage shard).")
          .at_least(0)
          .at_most(kMaxCount(20)),
      key(&D::parallel, &ParallelConfig::dp, "parallel.dp",
          "Data-parallel groups; 0: every compute rank left after holders, / (tp*pp).")
          .at_least(0)
          .at_most(kMaxCount(20)),
      key(&D::parallel, &ParallelConfig::tp, "parallel.tp", "Tensor-parallel ranks per group.")
          .at_least(1)
          .at_most(kMaxCount(16)),
      key(&D::parallel, &ParallelConfig::pp, "parallel.pp", "Pipeline stages per group.")
          .at_least(1)
          .at_most(kMaxCount(16)),
      key(&D::parallel, &ParallelConfig::micro_batches, "parallel.micro_batches",
          "Micro-batches each replica splits its share of the batch into (pipeline fill).")
          .at_least(1)
          .at_most(kMaxCount(20))
          .with_rule("divides train.batch_size / dp"),
      key(&D::parallel, &ParallelConfig::schedule, "parallel.schedule",
          "Pipeline schedule; both give identical losses, 1f1b holds fewer activations.")
          .one_of({"1f1b", "gpipe"}),
      enum_key(&D::parallel, &ParallelConfig::order, "parallel.order",
          "Order of a step's micro-batches on a stage. micro_batch: each micro-batch's forward and "
          "backward in turn. layer (one pipeline stage; as L2L does): every micro-batch through "
          "a layer before the next layer, so a bounded pd.cache_mb fetches each layer once per "
          "direction and a PD rank holds one layer's gradient at a time, for every "
          "micro-batch's activations at once. Losses equal micro_batch's up to the order the "
          "tied embedding adds its micro-batches' gradients.",
          {"micro_batch", "layer"})
          .with_rule("layer needs parallel.pp = 1"),
      key(&D::parallel, &ParallelConfig::comm, "parallel.comm",
          "Transport of compute-to-compute traffic (tensor-parallel all-reduces, the "
          "data-parallel gradient reduce, pipeline messages). mpi: MPI over "
          "host memory (a GPU rank stages through pinned memory). nccl: NCCL between the compute "
          "ranks' GPUs, on its own stream (needs a pdtrain built with CUDA and NCCL, "
          "compute.device = \"cuda\" and a GPU of its own for every compute rank; anything else "
          "is an error). auto: nccl when all of that holds, else mpi; the run header says which "
          "and why. The holders' fetches and pushes use MPI either way.")
          .one_of({"auto", "mpi", "nccl"}),
      key(&D::parallel, &ParallelConfig::nccl_timeout_s, "parallel.nccl_timeout_s",
          "NCCL's watchdog (NCCL itself waits forever on a peer that is alive but stalled): "
          "when a NCCL group's work on a compute rank has had its inputs ready and made no "
          "progress for this many seconds, the rank aborts the group's communicator and ends "
          "the job, naming the group (tp, dp or pp), the rank and the operation it waited on. "
          "Only time waiting on peers counts (not a long kernel or host work of this rank), but "
          "a peer legitimately busy elsewhere that long (a slow checkpoint write) trips it too. "
          "0: off.")
          .at_least(0)
          .at_most(1e7),

      key(&D::train, &TrainConfig::batch_size, "train.batch_size",
          "Sequences per optimizer step, over all data-parallel ranks.")
          .at_least(1)
          .at_most(kMaxCount(30)),
      key(&D::train, &TrainConfig::eval_every, "train.eval_every",
          "Validate every N steps and at the end; 0: at the end only.")
          .at_least(0)
          .at_most(kMaxCount(40)),
      key(&D::train, &TrainConfig::sample_every, "train.sample_every",
          "Every N steps, print 64 tokens sampled from the model (temperature 1, seed run.seed; "
          "holder 0 gathers the parameters, as llm.c samples during training); 0: never.")
          .at_least(0)
          .at_most(kMaxCount(40)),
      key(&D::train, &TrainConfig::eval_batches, "train.eval_batches",
          "Validation batches of train.batch_size sequences each.")
          .at_least(1)
          .at_most(kMaxCount(30)),
      key(&D::train, &TrainConfig::recompute, "train.recompute",
          "Activation recomputation in backward: attention (drop the T x T probabilities) or "
          "full (keep only layer outputs); losses are identical to none.")
          .one_of({"none", "attention", "full"}),
      enum_key(&D::train, &TrainConfig::precision, "train.precision",
          "bf16: mixed precision. Holders keep fp32 master weights and AdamW state and serve "
          "bf16 copies (half the fetch bytes); compute ranks run the matmuls on bf16 inputs with "
          "fp32 accumulation and keep LayerNorm, softmax, GELU and the loss in fp32; gradients "
          "stay fp32 (pd.push_codec decides the wire). No loss scaling: bf16 has fp32's exponent "
          "range.",
          {"fp32", "bf16"}),
      key(&D::train, &TrainConfig::on_divergence, "train.on_divergence",
          "When a step's loss or gradient norm is not finite (no parameter is updated with it, "
          "nothing after it is checkpointed): stop ends the run with exit status 5, naming the "
          "step, the quantity and the rank; rewind restarts from the newest valid checkpoint "
          "before that step (or step 0) with optimizer.lr and min_lr times "
          "train.rewind_lr_factor, skipping the batch of the step that diverged, at most "
          "train.max_rewinds times (then it stops). Rewinds are logged and reproducible.")
          .one_of({"stop", "rewind"}),
      key(&D::train, &TrainConfig::rewind_lr_factor, "train.rewind_lr_factor",
          "train.on_divergence = rewind: the learning-rate factor of each rewind.")
          .above(0.0)
          .below(1.0),
      key(&D::train, &TrainConfig::max_rewinds, "train.max_rewinds",
          "train.on_divergence = rewind: rewinds per run before a divergence stops it.")
          .at_least(1)
          .at_most(kMaxCount(10)),
      key(&D::train, &TrainConfig::loss_spike_factor, "train.loss_spike_factor",
          "> 0: a step whose loss exceeds this times the median of the previous "
          "train.loss_spike_window losses (of this run since its start or restart, once that "
          "many are known) diverges too; 0: only a loss or norm that is not finite does. In PD "
          "the step's update is applied before its loss is known.")
          .at_least(0.0),
      key(&D::train, &TrainConfig::loss_spike_window, "train.loss_spike_window",
          "train.loss_spike_factor: the steps whose median loss is the reference.")
          .at_least(1)
          .at_most(kMaxCount(20)),

      key(&D::compute, &ComputeConfig::device, "compute.device",
          "Where compute ranks run the model: cpu, or cuda (one NVIDIA GPU per compute rank, "
          "chosen by its index among the node's compute ranks; several ranks may share one "
          "GPU). Holders always run on CPUs. cuda needs a build with -DPDTRAIN_CUDA=ON.")
          .one_of({"cpu", "cuda"}),
      key(&D::compute, &ComputeConfig::tf32, "compute.tf32",
          "cuda: let fp32 matmuls use TF32 tensor cores (10-bit mantissa inputs, much faster); "
          "false keeps them exact fp32. No effect on cpu or in bf16 precision."),
      key(&D::compute, &ComputeConfig::attention, "compute.attention",
          "cuda: the attention kernels. cudnn: cuDNN's fused attention (its graph API; bf16 "
          "Q/K/V/O, fp32 softmax statistics, its deterministic backward), and an error where "
          "cuDNN refuses a bf16 run's shape. pdtrain: pdtrain's own fused kernel. auto: cuDNN "
          "where it runs, pdtrain's kernel elsewhere. cuDNN's attention is 16-bit only: fp32 "
          "runs use pdtrain's kernel with any value; every fall-back is said once on stderr and "
          "the run header names the family.")
          .one_of({"auto", "cudnn", "pdtrain"}),
      key(&D::optimizer, &OptimizerConfig::lr, "optimizer.lr",
          "Peak learning rate, reached after the warmup.")
          .above(0),
      key(&D::optimizer, &OptimizerConfig::min_lr, "optimizer.min_lr",
          "Learning rate the cosine schedule reaches at run.steps.")
          .at_least(0)
          .with_rule("<= optimizer.lr"),
      key(&D::optimizer, &OptimizerConfig::warmup_steps, "optimizer.warmup_steps",
          "Steps of linear warmup from 0 to optimizer.lr.")
          .at_least(0)
          .at_most(kMaxCount(40)),
      key(&D::optimizer, &OptimizerConfig::weight_decay, "optimizer.weight_decay",
          "Decoupled AdamW weight decay, applied to matrices only.")
          .at_least(0),
      key(&D::optimizer, &OptimizerConfig::grad_clip, "optimizer.grad_clip",
          "Clip the global gradient norm to this; 0: no clipping.")
          .at_least(0),
      key(&D::optimizer, &OptimizerConfig::beta1, "optimizer.beta1",
          "AdamW first-moment decay.")
          .at_least(0)
          .below(1),
      key(&D::optimizer, &OptimizerConfig::beta2, "optimizer.beta2",
          "AdamW second-moment decay.")
          .at_least(0)
          .below(1),
      key(&D::optimizer, &OptimizerConfig::eps, "optimizer.eps",
          "AdamW denominator epsilon.")
          .above(0),

      key(&D::pd, &PdConfig::fetch_codec, "pd.fetch_codec",
          "Encoding of parameter blocks sent by holders; bf16 halves the bytes and is lossy "
          "(compute runs on bf16-rounded weights), lz4 is lossless.")
          .one_of({"raw", "bf16", "lz4"}),
      key(&D::pd, &PdConfig::push_codec, "pd.push_codec",
          "Encoding of gradient blocks pushed to holders; bf16 is lossy, zstd lossless.")
          .one_of({"raw", "bf16", "zstd"}),
      key(&D::pd, &PdConfig::staleness, "pd.staleness",
          "Bounded staleness: step k computes on parameter version max(0, k-1-s), so compute "
          "runs up to s steps ahead of the updates; 0 is exact synchronous training.")
          .at_least(0)
          .at_most(3),
      key(&D::pd, &PdConfig::staleness_warmup, "pd.staleness_warmup",
          "With pd.staleness > 0: steps 1..N compute on the newest version (synchronous, as "
          "ZeRO-Offload warms up before its delayed update), later steps s versions behind. "
          "Early training is where a delay hurts most; on a long run N steps cost nothing.")
          .at_least(0)
          .at_most(kMaxCount(40)),
      key(&D::pd, &PdConfig::staleness_ramp, "pd.staleness_ramp",
          "With pd.staleness > 1: after the warm-up the delay rises by one every N steps (1, "
          "2, .. pd.staleness) instead of jumping to pd.staleness, a hand-over in steps; 0: "
          "at once.")
          .at_least(0)
          .at_most(kMaxCount(40)),
      key(&D::pd, &PdConfig::stale_correction, "pd.stale_correction",
          "With pd.staleness > 0, how a delayed step's version is served, extrapolated from "
          "the update that made it towards the version its gradient will be applied to (no "
          "extra memory or traffic): trend serves w + lead (w - w_before) + trend x the "
          "update's part from the momentum's last change (a second-order extrapolation; "
          "lead, trend = 1, 1/2 at delay 1, 3/4, 9/4 at 2, 5/4, 4 at 3); predict serves w + "
          "(s + 1/2) (w - w_before); none serves the version itself (plain delayed AdamW). "
          "Evaluated and warm-up versions are always served exactly.")
          .one_of({"none", "predict", "trend"}),
      key(&D::pd, &PdConfig::prefetch_depth, "pd.prefetch_depth",
          "Parameter uses (a layer, or the embedding/head) a compute rank fetches ahead of the "
          "one it computes on, with non-blocking fetches, as far as pd.cache_mb leaves room "
          "(the default, 64, means as far as memory allows: one round trip per step for a "
          "small model); 0: fetch each when needed (blocking). Exact: any depth gives the same "
          "numbers.")
          .at_least(0)
          .at_most(64),
      key(&D::pd, &PdConfig::cache_mb, "pd.cache_mb",
          "Most parameter MiB resident on a compute rank (PD only); 0: no limit (a stage's "
          "parameters stay until the next version). When full, the unit used farthest in the "
          "future is evicted and fetched again when needed. Must hold the largest single use "
          "(one layer, or the tied embedding with the final LayerNorm).")
          .at_least(0),
      key(&D::pd, &PdConfig::cache_warm_steps, "pd.cache_warm_steps",
          "Cold start: the first N steps keep whole stages resident (no pd.cache_mb limit; "
          "passes on parameter versions below N, so steps 1..N at staleness 0 and N+s at "
          "staleness s), then the cache tightens to pd.cache_mb. Pairs with "
          "optimizer.warmup_steps: while the learning rate ramps up, full-parameter steps "
          "fetch each layer once; the decoupling grows afterwards. Exact: the same numbers as "
          "without. 0: bounded from the first step.")
          .at_least(0)
          .at_most(kMaxCount(40)),
      key(&D::pd, &PdConfig::fetch_thread, "pd.fetch_thread",
          "Move fetches (requests, replies, relays, CRC checks, unpacking) on a background thread "
          "of each compute rank, so they overlap compute even without asynchronous MPI progress; "
          "needs MPI_THREAD_MULTIPLE, else the compute thread does it between layers. Off by "
          "default: it pays only with a spare core per compute rank, and it drives the MPI "
          "library from two threads at once."),
      key(&D::pd, &PdConfig::fetch_path, "pd.fetch_path",
          "How fetched blocks reach a compute rank. auto: from a holder on the same node "
          "through shared memory (the holder publishes each version into a segment the node's "
          "ranks map; the compute rank copies a block into place and checks its CRC32C in the "
          "same pass; one more copy of the holder's blocks per kept version in its memory and "
          "in /dev/shm), from other holders by MPI message; by message everywhere when the "
          "fetch codec is lz4 or /dev/shm lacks room. mpi: by MPI message everywhere. Exact: "
          "the same numbers either way.")
          .one_of({"auto", "mpi"}),
      key(&D::pd, &PdConfig::pushes_in_flight, "pd.pushes_in_flight",
          "Units whose gradients a compute rank keeps on the wire while its backward goes on "
          "(each unit's gradient is reduced and pushed as soon as it is final). 1: a unit's "
          "push overlaps the next unit's backward, for one more unit of gradient memory; 0: "
          "backward waits for each push, which with one replica goes from the unit's own "
          "gradient memory without a packed copy (the least memory: one layer's gradients "
          "instead of two; the push's time is exposed); more: slower links. Exact: any "
          "value gives the same numbers. The dry run prints the gradient bound it gives.")
          .at_least(0)
          .at_most(8),
      key(&D::pd, &PdConfig::holder_threads, "pd.holder_threads",
          "Threads of each holder's update (gradient sums and sums of squares as pushes arrive, "
          "then AdamW, wire encoding and CRC fused per slice); 0: the cores the holder process "
          "is bound to (mpirun --bind-to, Slurm), or, unbound, its share of the node's cores "
          "among the job's ranks there; at most 32. Exact: any count gives the same numbers. "
          "Give holders their own cores (one holder per node or socket) and bind them.")
          .at_least(0)
          .at_most(256),

      key(&D::checkpoint, &CheckpointConfig::every, "checkpoint.every",
          "Write a checkpoint every N steps; 0: only at the end (and on a stop signal: SIGTERM, "
          "SIGINT, SIGUSR1).")
          .at_least(0)
          .at_most(kMaxCount(40)),
      key(&D::checkpoint, &CheckpointConfig::codec, "checkpoint.codec",
          "raw, zstd (lossless), xor (lossless delta to the last anchor), bitdelta (lossy: "
          "parameters as a few-bit delta to the last anchor, Adam m and v quantized; see "
          "checkpoint.bitdelta_bits, checkpoint.moment_bits). Anchors are always lossless.")
          .one_of({"raw", "zstd", "xor", "bitdelta"}),
      key(&D::checkpoint, &CheckpointConfig::bitdelta_bits, "checkpoint.bitdelta_bits",
          "bitdelta: bits per parameter of its delta to the anchor, with a scale pair per 256 "
          "values; 1 is BitDelta's sign x mean |delta|, 2..8 uniform levels between the "
          "group's least and largest delta.")
          .at_least(1)
          .at_most(8),
      key(&D::checkpoint, &CheckpointConfig::moment_bits, "checkpoint.moment_bits",
          "bitdelta: bits per Adam moment value, with a scale pair per 256 values (m: uniform "
          "levels; v: levels of its log, code 0 exact zero); 0 keeps m and v lossless (xor to "
          "the anchor). 1 is not a choice.")
          .at_least(0)
          .at_most(8),
      key(&D::checkpoint, &CheckpointConfig::anchor_every, "checkpoint.anchor_every",
          "Delta codecs: every N-th checkpoint is a full (zstd) anchor.")
          .at_least(1)
          .at_most(kMaxCount(20)),
      key(&D::checkpoint, &CheckpointConfig::keep, "checkpoint.keep",
          "Newest checkpoints kept (never an anchor a kept delta needs); 0 keeps all.")
          .at_least(0)
          .at_most(kMaxCount(20)),
      key(&D::checkpoint, &CheckpointConfig::async, "checkpoint.async",
          "Copy the state and encode it in the background while training continues."),
      key(&D::checkpoint, &CheckpointConfig::dir, "checkpoint.dir",
          "Checkpoint directory; empty: <run.out_dir>/checkpoints."),

      key(&D::output, &OutputConfig::trace, "output.trace",
          "Write a Chrome trace per rank (OUT/trace/rank-<r>.json) and a merged one."),
      key(&D::output, &OutputConfig::trajectory_every, "output.trajectory_every",
          "Parameter trajectories: every N steps, each tensor's (per layer) parameter norm, update "
          "norm and update-to-weight ratio into OUT/trajectories.csv, computed by the holders "
          "that own its blocks; 0: none.")
          .at_least(0)
          .at_most(kMaxCount(40)),
  };
}

// Shortest text that reads back to the same double, exponent without leading zeros
// ("3e-4", not "3e-04"). May look like an integer ("1"); toml_literal fixes that up.
std::string shortest(double d) {
  char buf[64];
  const auto res = std::to_chars(buf, buf + sizeof buf, d);
  std::string s(buf, res.ptr);
  if (auto e = s.find('e'); e != std::string::npos) {
    std::size_t digits = e + 1 + ((s[e + 1] == '-' || s[e + 1] == '+') ? 1 : 0);
    while (digits + 1 < s.size() && s[digits] == '0') s.erase(digits, 1);
  }
  return s;
}

// Numbers in messages and docs read as a person writes them: "> 0", "got -1".
std::string number_text(const Value& v) {
  if (const auto* d = std::get_if<double>(&v)) {
    return std::isfinite(*d) ? shortest(*d) : toml_literal(v);
  }
  return toml_literal(v);
}

std::string format_bound(double v, KeyType t) {
  if (t == KeyType::integer) return std::to_string(static_cast<std::int64_t>(v));
  return number_text(Value{v});
}

double as_double(const Value& v) {
  if (const auto* i = std::get_if<std::int64_t>(&v)) return static_cast<double>(*i);
  return std::get<double>(v);
}

std::string check_number(const KeySpec& spec, const Value& v) {
  const double x = as_double(v);
  // DBL_MAX is what toml11 yields for overflowing floats such as 1e999.
  if (spec.type == KeyType::floating &&
      (!std::isfinite(x) || std::fabs(x) == std::numeric_limits<double>::max()))
    return "must be a finite number, got " + number_text(v);
  const bool low_ok = !spec.min || (spec.min->open ? x > spec.min->value : x >= spec.min->value);
  const bool high_ok = !spec.max || (spec.max->open ? x < spec.max->value : x <= spec.max->value);
  if (low_ok && high_ok) return "";
  const bool interval = spec.min && spec.max;
  return std::string("must be ") + (interval ? "in " : "") + range_text(spec) + ", got " +
         number_text(v);
}

std::string lower(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return out;
}

// How far a mistyped name may be from a suggestion: about one edit per three characters.
bool close_enough(std::size_t distance, std::string_view typed) {
  return distance <= std::clamp<std::size_t>(typed.size() / 3, 1, 3);
}

}  // namespace

const std::vector<KeySpec>& schema() {
  static const std::vector<KeySpec> table = build_schema();
  return table;
}

const std::vector<SectionSpec>& sections() {
  static const std::vector<SectionSpec> table = {
      {"run", "What the run is called, how long it trains and where it writes."},
      {"model", "The GPT-2 model shape."},
      {"data", "Where training and validation tokens come from."},
      {"parallel", "How the MPI ranks are split into holders and compute groups."},
      {"train", "Batch size and validation."},
      {"compute", "The device compute ranks run on."},
      {"optimizer", "AdamW with linear warmup and cosine decay."},
      {"pd", "The parameter/compute-decoupling wire between holders and compute ranks."},
      {"checkpoint", "HDF5 checkpoints written by the holders (docs/checkpoint-format.md)."},
      {"output", "What the run writes besides metrics.csv."},
  };
  return table;
}

const KeySpec* find_key(std::string_view dotted) {
  for (const auto& k : schema())
    if (k.key == dotted) return &k;
  return nullptr;
}

bool is_section(std::string_view name) {
  return std::any_of(sections().begin(), sections().end(),
                     [&](const SectionSpec& s) { return s.name == name; });
}

Value default_value(const KeySpec& spec) { return spec.get(Deck{}); }

std::string check_value(const KeySpec& spec, const Value& v) {
  switch (spec.type) {
    case KeyType::integer:
      // toml11 saturates integers that overflow, so the extremes mean "too large".
      if (const auto i = std::get<std::int64_t>(v); i == std::numeric_limits<std::int64_t>::max() ||
                                                    i == std::numeric_limits<std::int64_t>::min())
        return "does not fit in a 64-bit integer";
      return check_number(spec, v);
    case KeyType::floating: return check_number(spec, v);
    case KeyType::boolean: return "";
    case KeyType::string:
      if (spec.non_empty && std::get<std::string>(v).empty()) return "must not be empty";
      return "";
    case KeyType::choice: {
      const auto& s = std::get<std::string>(v);
      if (std::find(spec.choices.begin(), spec.choices.end(), s) != spec.choices.end()) return "";
      std::string list;
      for (const auto& c : spec.choices) list += (list.empty() ? "" : ", ") + toml_literal(Value{c});
      return "must be one of " + list + ", got " + toml_literal(v);
    }
  }
  return "";
}

std::string toml_literal(const Value& v) {
  if (const auto* i = std::get_if<std::int64_t>(&v)) return std::to_string(*i);
  if (const auto* b = std::get_if<bool>(&v)) return *b ? "true" : "false";
  if (const auto* d = std::get_if<double>(&v)) {
    if (std::isnan(*d)) return "nan";
    if (std::isinf(*d)) return *d > 0 ? "inf" : "-inf";
    std::string s = shortest(*d);
    // TOML needs a '.' or exponent to read a float back as a float.
    if (s.find_first_of(".e") == std::string::npos) s += ".0";
    return s;
  }
  std::string out = "\"";
  for (const char c : std::get<std::string>(v)) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      case '\r': out += "\\r"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
          char esc[8];
          std::snprintf(esc, sizeof esc, "\\u%04x", static_cast<unsigned char>(c));
          out += esc;
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

std::string type_phrase(KeyType t) {
  switch (t) {
    case KeyType::integer: return "an integer";
    case KeyType::floating: return "a number";
    case KeyType::boolean: return "a boolean (true or false)";
    case KeyType::string: return "a string";
    case KeyType::choice: return "a string";
  }
  return "a value";
}

std::string range_text(const KeySpec& spec) {
  const auto& lo = spec.min;
  const auto& hi = spec.max;
  if (lo && hi)
    return std::string(lo->open ? "(" : "[") + format_bound(lo->value, spec.type) + ", " +
           format_bound(hi->value, spec.type) + (hi->open ? ")" : "]");
  if (lo) return std::string(lo->open ? "> " : ">= ") + format_bound(lo->value, spec.type);
  if (hi) return std::string(hi->open ? "< " : "<= ") + format_bound(hi->value, spec.type);
  return "";
}

std::size_t edit_distance(std::string_view a_in, std::string_view b_in) {
  const std::string a = lower(a_in), b = lower(b_in);
  // Full table: names are short, and the adjacent-swap rule needs two rows back.
  std::vector<std::vector<std::size_t>> d(a.size() + 1, std::vector<std::size_t>(b.size() + 1));
  for (std::size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (std::size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  }
  return d[a.size()][b.size()];
}

std::optional<std::string> suggest_key(std::string_view typed) {
  const auto dot = typed.find('.');
  const std::string_view section = dot == std::string_view::npos ? "" : typed.substr(0, dot);
  const std::string_view bare = dot == std::string_view::npos ? typed : typed.substr(dot + 1);
  std::optional<std::string> best;
  std::size_t best_d = std::numeric_limits<std::size_t>::max();
  auto consider = [&](const KeySpec& k, std::size_t d, std::string_view compared) {
    if (d < best_d && close_enough(d, compared)) {
      best_d = d;
      best = k.key;
    }
  };
  for (const auto& k : schema()) {
    consider(k, edit_distance(typed, k.key), typed);
    // A bare name is compared within its own section; a bare name with no section, or the
    // exact name of a key in another section, is compared against every section.
    if (section == k.section || section.empty())
      consider(k, edit_distance(bare, k.name), bare);
    else if (lower(bare) == k.name)
      consider(k, 1, bare);
  }
  return best;
}

std::optional<std::string> suggest_section(std::string_view typed) {
  std::optional<std::string> best;
  std::size_t best_d = std::numeric_limits<std::size_t>::max();
  for (const auto& s : sections()) {
    const auto d = edit_distance(typed, s.name);
    if (d < best_d && close_enough(d, typed)) {
      best_d = d;
      best = s.name;
    }
  }
  return best;
}

}  // namespace pdtrain::deck
