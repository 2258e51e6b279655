// Deck parsing: valid decks, every kind of bad deck (with the line it must name), --set,
// the resolved deck round trip, where(), file loading and the generated reference.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

#include "pdtrain/core/error.hpp"
#include "pdtrain/deck/deck.hpp"
#include "pdtrain/deck/schema.hpp"

namespace pdtrain {
namespace {

using Overrides = std::vector<std::string>;

// Joins lines with '\n' so a test's line numbers are the 1-based index in the list.
std::string lines(const std::vector<std::string>& ls) {
  std::string s;
  for (const auto& l : ls) s += l + "\n";
  return s;
}

Deck parse(const std::string& text, const Overrides& o = {}) {
  return parse_deck(text, "t.toml", o);
}

// The message of the deck error `text` + `o` must raise; fails the test if none is raised.
std::string deck_error(const std::string& text, const Overrides& o = {}) {
  try {
    parse(text, o);
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ExitCode::deck) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "expected a deck error for:\n" << text;
  return "";
}

bool starts_with(const std::string& s, const std::string& prefix) {
  return s.rfind(prefix, 0) == 0;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A deck that sets every key to something other than its default.
const std::vector<std::string> kFullDeck = {
    "# every key",                       // 1
    "[run]",                             // 2
    "name = \"full\"",                   // 3
    "seed = -7",                         // 4
    "steps = 1000",                      // 5
    "out_dir = \"/tmp/out dir\"",        // 6
    "log_every = 10",                    // 7
    "[model]",                           // 8
    "n_layer = 12",                      // 9
    "n_head = 12",                       // 10
    "d_model = 768",                     // 11
    "vocab_size = 50257",                // 12
    "padded_vocab_size = 50304",         // 13
    "seq_len = 1024",                    // 14
    "max_seq_len = 2048",                // 15
    "init_std = 0.01",                   // 16
    "init = \"llmc:gpt2_124M.bin\"",      // 17
    "[data]",                            // 18
    "source = \"tokens\"",               // 19
    "path = \"data/train.bin\"",         // 20
    "val_path = \"data/val.bin\"",       // 21
    "val_fraction = 0.05",               // 22
    "copy_lag = 3",                      // 23
    "copy_prob = 0.5",                   // 24
    "[parallel]",                        // 25
    "holders = 2",                       // 26
    "dp = 4",                            // 27
    "tp = 2",                            // 28
    "pp = 3",                            // 29
    "micro_batches = 4",                 // 30
    "schedule = \"gpipe\"",              // 31
    "order = \"layer\"",                 // 32
    "comm = \"nccl\"",                  // 33
    "nccl_timeout_s = 120.5",           // 34
    "[train]",                           // 35
    "batch_size = 64",                   // 36
    "eval_every = 0",                    // 37
    "sample_every = 5",                  // 38
    "eval_batches = 10",                 // 39
    "recompute = \"full\"",              // 40
    "precision = \"bf16\"",              // 41
    "on_divergence = \"rewind\"",        // 42
    "rewind_lr_factor = 0.25",           // 43
    "max_rewinds = 2",                   // 44
    "loss_spike_factor = 4.0",           // 45
    "loss_spike_window = 8",             // 46
    "[optimizer]",                       // 47
    "lr = 6e-4",                         // 48
    "min_lr = 6e-5",                     // 49
    "warmup_steps = 700",                // 50
    "weight_decay = 0.0",                // 51
    "grad_clip = 0.5",                   // 52
    "beta1 = 0.85",                      // 53
    "beta2 = 0.999",                     // 54
    "eps = 1e-6",                        // 55
    "[pd]",                              // 56
    "fetch_codec = \"bf16\"",            // 57
    "push_codec = \"zstd\"",             // 58
    "staleness = 2",                     // 59
    "prefetch_depth = 3",                // 60
    "cache_mb = 64.5",                   // 61
    "fetch_thread = true",               // 62
    "cache_warm_steps = 7",              // 63
    "holder_threads = 2",                // 64
    "staleness_warmup = 50",             // 65
    "stale_correction = \"none\"",       // 66
    "staleness_ramp = 25",               // 67
    "pushes_in_flight = 0",              // 68
    "fetch_path = \"mpi\"",              // 69
    "[checkpoint]",                      // 70
    "every = 100",                       // 71
    "codec = \"xor\"",                   // 72
    "anchor_every = 5",                  // 73
    "keep = 2",                          // 74
    "async = true",                      // 75
    "dir = \"/scratch/ckpt\"",           // 76
    "bitdelta_bits = 3",                 // 77
    "moment_bits = 5",                   // 78
    "[output]",                          // 79
    "trace = true",                      // 80
    "trajectory_every = 25",             // 81
    "[compute]",                         // 82
    "device = \"cuda\"",                 // 83
    "tf32 = true",                       // 84
    "attention = \"pdtrain\"",             // 85
};

// ------------------------------------------------------------------------------ valid decks

TEST(DeckValid, EmptyDeckGivesEveryDefault) {
  const Deck d = parse("");
  Deck expect;
  expect.run.out_dir = "runs/default";
  expect.checkpoint.dir = "runs/default/checkpoints";
  EXPECT_TRUE(same_settings(d, expect));
  EXPECT_EQ(d.source_name, "t.toml");
  EXPECT_EQ(d.source_text, "");
  ASSERT_EQ(d.origin.size(), deck::schema().size());
  for (const auto& [key, from] : d.origin) EXPECT_EQ(from, "default") << key;
}

TEST(DeckValid, CommentsAndEmptySectionsChangeNothing) {
  const Deck d = parse(lines({"# nothing here", "[run]", "", "[model] # empty", "[optimizer]"}));
  EXPECT_EQ(d.model.n_layer, 2);
  EXPECT_EQ(d.optimizer.lr, 3e-3);
  EXPECT_EQ(d.origin.at("model.n_layer"), "default");
}

TEST(DeckValid, FullDeckSetsEveryKey) {
  const Deck d = parse(lines(kFullDeck));
  EXPECT_EQ(d.run.name, "full");
  EXPECT_EQ(d.run.seed, -7);
  EXPECT_EQ(d.run.steps, 1000);
  EXPECT_EQ(d.run.out_dir, "/tmp/out dir");  // explicit, not runs/<name>
  EXPECT_EQ(d.run.log_every, 10);
  EXPECT_EQ(d.model.n_layer, 12);
  EXPECT_EQ(d.model.n_head, 12);
  EXPECT_EQ(d.model.d_model, 768);
  EXPECT_EQ(d.model.vocab_size, 50257);
  EXPECT_EQ(d.model.padded_vocab_size, 50304);
  EXPECT_EQ(d.model.seq_len, 1024);
  EXPECT_EQ(d.model.max_seq_len, 2048);
  EXPECT_EQ(d.model.init_std, 0.01);
  EXPECT_EQ(d.data.source, "tokens");
  EXPECT_EQ(d.data.path, "data/train.bin");
  EXPECT_EQ(d.data.val_path, "data/val.bin");
  EXPECT_EQ(d.data.val_fraction, 0.05);
  EXPECT_EQ(d.data.copy_lag, 3);
  EXPECT_EQ(d.data.copy_prob, 0.5);
  EXPECT_EQ(d.parallel.holders, 2);
  EXPECT_EQ(d.parallel.dp, 4);
  EXPECT_EQ(d.parallel.tp, 2);
  EXPECT_EQ(d.parallel.pp, 3);
  EXPECT_EQ(d.train.batch_size, 64);
  EXPECT_EQ(d.train.eval_every, 0);
  EXPECT_EQ(d.train.eval_batches, 10);
  EXPECT_EQ(d.train.on_divergence, "rewind");
  EXPECT_EQ(d.train.rewind_lr_factor, 0.25);
  EXPECT_EQ(d.train.max_rewinds, 2);
  EXPECT_EQ(d.train.loss_spike_factor, 4.0);
  EXPECT_EQ(d.train.loss_spike_window, 8);
  EXPECT_EQ(d.optimizer.lr, 6e-4);
  EXPECT_EQ(d.optimizer.min_lr, 6e-5);
  EXPECT_EQ(d.optimizer.warmup_steps, 700);
  EXPECT_EQ(d.optimizer.weight_decay, 0.0);
  EXPECT_EQ(d.optimizer.grad_clip, 0.5);
  EXPECT_EQ(d.optimizer.beta1, 0.85);
  EXPECT_EQ(d.optimizer.beta2, 0.999);
  EXPECT_EQ(d.optimizer.eps, 1e-6);
  EXPECT_EQ(d.compute.device, "cuda");
  EXPECT_TRUE(d.compute.tf32);
  EXPECT_EQ(d.compute.attention, "pdtrain");
  EXPECT_EQ(d.checkpoint.bitdelta_bits, 3);
  EXPECT_EQ(d.checkpoint.moment_bits, 5);
  // Every key is in the file, so none is a default, and each origin is its own line.
  for (const auto& [key, from] : d.origin) EXPECT_NE(from, "default") << key;
  EXPECT_EQ(d.origin.at("run.name"), "t.toml:3");
  EXPECT_EQ(d.origin.at("model.max_seq_len"), "t.toml:15");
  EXPECT_EQ(d.origin.at("optimizer.eps"), "t.toml:55");
  EXPECT_EQ(d.train.recompute, "full");
  EXPECT_EQ(d.model.init, "llmc:gpt2_124M.bin");
  EXPECT_EQ(d.parallel.micro_batches, 4);
  EXPECT_EQ(d.parallel.schedule, "gpipe");
  EXPECT_EQ(d.parallel.order, StageOrder::layer);
  EXPECT_EQ(d.parallel.comm, "nccl");
  EXPECT_EQ(d.parallel.nccl_timeout_s, 120.5);
  EXPECT_TRUE(d.output.trace);
  EXPECT_EQ(d.output.trajectory_every, 25);
  EXPECT_EQ(d.train.sample_every, 5);
  EXPECT_EQ(d.pd.fetch_codec, "bf16");
  EXPECT_EQ(d.pd.push_codec, "zstd");
  EXPECT_EQ(d.pd.staleness, 2);
  EXPECT_EQ(d.pd.prefetch_depth, 3);
  EXPECT_EQ(d.pd.cache_mb, 64.5);
  EXPECT_EQ(d.pd.cache_warm_steps, 7);
  EXPECT_EQ(d.pd.staleness_warmup, 50);
  EXPECT_EQ(d.pd.stale_correction, "none");
  EXPECT_EQ(d.pd.staleness_ramp, 25);
  EXPECT_TRUE(d.pd.fetch_thread);
  EXPECT_EQ(d.pd.holder_threads, 2);
  EXPECT_EQ(d.pd.pushes_in_flight, 0);
  EXPECT_EQ(d.pd.fetch_path, "mpi");
  EXPECT_EQ(d.train.precision, Precision::bf16);
  EXPECT_EQ(d.checkpoint.codec, "xor");
  EXPECT_EQ(d.checkpoint.dir, "/scratch/ckpt");
  EXPECT_TRUE(d.checkpoint.async);
}

TEST(DeckValid, EmbeddedDefaultDeckParses) {
  const Deck d = parse_deck(default_deck_text(), "<default deck>", {});
  EXPECT_EQ(d.run.steps, 600);  // the default deck sets this; the struct default is 200
  EXPECT_EQ(d.train.batch_size, 16);
  EXPECT_EQ(d.run.out_dir, "runs/default");
  EXPECT_TRUE(starts_with(d.origin.at("run.steps"), "<default deck>:")) << d.origin.at("run.steps");
  EXPECT_EQ(d.source_text, default_deck_text());
}

TEST(DeckValid, EmbeddedDefaultDeckIsInputDefaultToml) {
  EXPECT_EQ(read_file(PDTRAIN_SOURCE_DIR "/input/default.toml"), default_deck_text());
}

TEST(DeckValid, IntegersAreAcceptedForFloats) {
  const Deck d = parse(lines({"[optimizer]", "lr = 1", "grad_clip = 0", "min_lr = 0"}));
  EXPECT_EQ(d.optimizer.lr, 1.0);
  EXPECT_EQ(d.optimizer.grad_clip, 0.0);
  EXPECT_EQ(d.optimizer.min_lr, 0.0);
}

TEST(DeckValid, DottedKeysAndInlineTablesAreSections) {
  const Deck d = parse(lines({"model.n_layer = 6", "optimizer = { lr = 0.01, beta1 = 0.8 }"}));
  EXPECT_EQ(d.model.n_layer, 6);
  EXPECT_EQ(d.optimizer.lr, 0.01);
  EXPECT_EQ(d.optimizer.beta1, 0.8);
  EXPECT_EQ(d.origin.at("optimizer.beta1"), "t.toml:2");
}

TEST(DeckValid, OutDirDefaultsToRunsSlashName) {
  EXPECT_EQ(parse(lines({"[run]", "name = \"exp1\""})).run.out_dir, "runs/exp1");
  EXPECT_EQ(parse("", {"run.name=exp2"}).run.out_dir, "runs/exp2");
  EXPECT_EQ(parse(lines({"[run]", "out_dir = \"o\""})).run.out_dir, "o");
}

TEST(DeckValid, PaddedVocabZeroStaysZero) {
  const Deck d = parse(lines({"[model]", "vocab_size = 50257", "padded_vocab_size = 0"}));
  EXPECT_EQ(d.model.padded_vocab_size, 0);  // the model rounds it up, not the deck
  EXPECT_EQ(parse(lines({"[model]", "padded_vocab_size = 64"})).model.padded_vocab_size, 64);
}

TEST(DeckValid, RangeEdgesThatAreAllowed) {
  const Deck d = parse(lines({"[data]", "copy_prob = 1.0", "copy_lag = 63", "[optimizer]",
                              "beta1 = 0", "min_lr = 3e-3", "[parallel]", "holders = 0"}));
  EXPECT_EQ(d.data.copy_prob, 1.0);
  EXPECT_EQ(d.data.copy_lag, 63);  // seq_len 64
  EXPECT_EQ(d.optimizer.beta1, 0.0);
  EXPECT_EQ(d.optimizer.min_lr, d.optimizer.lr);
  EXPECT_EQ(d.parallel.holders, 0);
}

TEST(DeckValid, CopyLagIsOnlyCheckedForTheSyntheticSource) {
  const Deck d = parse(lines({"[model]", "seq_len = 4", "[data]", "source = \"text\"",
                              "path = \"corpus.txt\""}));
  EXPECT_EQ(d.data.copy_lag, 8);
  EXPECT_EQ(d.data.source, "text");
}

// -------------------------------------------------------------------------------- bad decks

TEST(DeckErrors, UnknownKeySuggestsTheNearestKey) {
  const std::string text = lines({"# a deck", "[run]", "steps = 10", "", "[model]", "n_head = 4",
                                  "n_layr = 6", "d_model = 64"});
  EXPECT_EQ(deck_error(text), "t.toml:7: unknown key 'model.n_layr'; did you mean 'model.n_layer'?");
}

TEST(DeckErrors, UnknownKeyFarFromEveryKeyHasNoSuggestion) {
  EXPECT_EQ(deck_error(lines({"[model]", "dropout = 0.1"})), "t.toml:2: unknown key 'model.dropout'");
}

TEST(DeckErrors, KeyInTheWrongSectionSuggestsItsSection) {
  EXPECT_EQ(deck_error(lines({"[train]", "batch_size = 4", "lr = 0.1"})),
            "t.toml:3: unknown key 'train.lr'; did you mean 'optimizer.lr'?");
  EXPECT_EQ(deck_error(lines({"", "warmup_steps = 5"})),
            "t.toml:2: unknown key 'warmup_steps'; did you mean 'optimizer.warmup_steps'?");
}

TEST(DeckErrors, UnknownSectionSuggestsTheNearestSection) {
  EXPECT_EQ(deck_error(lines({"[run]", "steps = 5", "[modle]", "n_layer = 2"})),
            "t.toml:3: unknown section [modle]; did you mean [model]?");
  EXPECT_EQ(deck_error(lines({"[logging]", "level = 1"})), "t.toml:1: unknown section [logging]");
}

TEST(DeckErrors, NestedTablesAreUnknownKeys) {
  EXPECT_EQ(deck_error(lines({"[model]", "n_layer = 2", "[model.attn]", "heads = 2"})),
            "t.toml:3: unknown key 'model.attn'");
}

TEST(DeckErrors, SectionThatIsNotATable) {
  EXPECT_EQ(deck_error(lines({"# x", "run = 5"})),
            "t.toml:2: run: expected a table [run], got an integer (5)");
}

TEST(DeckErrors, FirstErrorInTheFileIsReported) {
  // toml11 keeps keys in hash order; the message must still name the earliest bad line.
  const std::string text = lines({"[optimizer]", "lr = -1", "[model]", "n_layr = 1", "[zzz]"});
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(starts_with(deck_error(text), "t.toml:2:"));
}

TEST(DeckErrors, WrongTypes) {
  EXPECT_EQ(deck_error(lines({"[run]", "", "[model]", "n_layer = \"six\""})),
            "t.toml:4: model.n_layer: expected an integer, got a string (\"six\")");
  EXPECT_EQ(deck_error(lines({"[model]", "n_layer = 2.0"})),
            "t.toml:2: model.n_layer: expected an integer, got a float (2.0)");
  EXPECT_EQ(deck_error(lines({"[optimizer]", "lr = \"0.1\""})),
            "t.toml:2: optimizer.lr: expected a number, got a string (\"0.1\")");
  EXPECT_EQ(deck_error(lines({"[run]", "name = 3"})),
            "t.toml:2: run.name: expected a string, got an integer (3)");
  EXPECT_EQ(deck_error(lines({"[train]", "batch_size = true"})),
            "t.toml:2: train.batch_size: expected an integer, got a boolean (true)");
  EXPECT_EQ(deck_error(lines({"[parallel]", "tp = [2]"})),
            "t.toml:2: parallel.tp: expected an integer, got an array");
}

// Sizes that would wrap a parameter count or a rank count are refused by the key's range,
// naming the file, line and key (each was accepted before, then crashed or printed garbage).
TEST(DeckErrors, SizesBeyondTheirRangesNameTheKey) {
  EXPECT_EQ(deck_error(lines({"[model]", "d_model = 4611686018427387904"})),
            "t.toml:2: model.d_model: must be in [1, 1048576], got 4611686018427387904");
  EXPECT_EQ(deck_error(lines({"[model]", "padded_vocab_size = 4611686018427387904"})),
            "t.toml:2: model.padded_vocab_size: must be in [0, 16777216], got 4611686018427387904");
  EXPECT_EQ(deck_error(lines({"[model]", "d_model = 1073741824"})),
            "t.toml:2: model.d_model: must be in [1, 1048576], got 1073741824");
  EXPECT_EQ(deck_error(lines({"[model]", "n_layer = 2147483648"})),
            "t.toml:2: model.n_layer: must be in [1, 65536], got 2147483648");
  EXPECT_EQ(deck_error(lines({"[parallel]", "holders = 2147483648"})),
            "t.toml:2: parallel.holders: must be in [0, 1048576], got 2147483648");
}

// toml11 parses nested arrays by recursion: a deck nested thousands deep overflowed the stack.
TEST(DeckErrors, DeepNestingIsRefusedBeforeParsing) {
  const std::string deep = std::string(5000, '[') + std::string(5000, ']');
  EXPECT_EQ(deck_error(lines({"[run]", "name = \"x\"", "", "seed = " + deep})),
            "t.toml:4: values nested 5000 deep (arrays and inline tables); a deck may nest at most 64");
  // Brackets inside strings and comments are not nesting.
  const std::string brackets(200, '[');
  const Deck d = parse_deck(lines({"[run]", "name = \"" + brackets + "\"  # " + brackets,
                                   "out_dir = \"\"\"\\\"" + brackets + "\"\"\"",
                                   "[data]", "path = \'\'\'" + brackets + "\'\'\'"}),
                            "t.toml", {});
  EXPECT_EQ(d.run.name, brackets);
  EXPECT_EQ(d.run.out_dir, "\"" + brackets);
  EXPECT_EQ(d.data.path, brackets);
}

TEST(DeckErrors, EndlessDeckFileIsRefusedBySize) {
  try {
    read_deck_text("/dev/zero");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ExitCode::deck);
    EXPECT_EQ(std::string(e.what()),
              "deck file '/dev/zero' is larger than 1048576 bytes (the most a deck file may be); is it "
              "the right file?");
  }
}

// A checkpoint keeps the resolved deck in one HDF5 attribute (at most 64 KiB).
TEST(DeckErrors, ResolvedDeckTooLargeForACheckpointNamesTheLongestValue) {
  const std::string name(70000, 'n');
  const std::string msg = deck_error(lines({"[run]", "name = \"" + name + "\""}));
  EXPECT_NE(msg.find("t.toml:2: run.name: its value is 70000 bytes long"), std::string::npos) << msg;
  EXPECT_NE(msg.find("one HDF5 attribute of at most 60000 bytes"), std::string::npos) << msg;
}

TEST(DeckErrors, OutOfRange) {
  EXPECT_EQ(deck_error(lines({"[optimizer]", "beta1 = 0.9", "lr = -0.001"})),
            "t.toml:3: optimizer.lr: must be > 0, got -0.001");
  EXPECT_EQ(deck_error(lines({"[optimizer]", "beta2 = 1.0"})),
            "t.toml:2: optimizer.beta2: must be in [0, 1), got 1");
  EXPECT_EQ(deck_error(lines({"[run]", "steps = 0"})), "t.toml:2: run.steps: must be in [1, 1099511627776], got 0");
  EXPECT_EQ(deck_error(lines({"[data]", "val_fraction = 0"})),
            "t.toml:2: data.val_fraction: must be in (0, 1), got 0");
  EXPECT_EQ(deck_error(lines({"[data]", "copy_prob = 1.5"})),
            "t.toml:2: data.copy_prob: must be in [0, 1], got 1.5");
  EXPECT_EQ(deck_error(lines({"[parallel]", "tp = 0"})), "t.toml:2: parallel.tp: must be in [1, 65536], got 0");
  EXPECT_EQ(deck_error(lines({"[parallel]", "nccl_timeout_s = -1"})),
            "t.toml:2: parallel.nccl_timeout_s: must be in [0, 1e+7], got -1");
  EXPECT_EQ(deck_error(lines({"[model]", "vocab_size = 1"})),
            "t.toml:2: model.vocab_size: must be in [2, 16777216], got 1");
  EXPECT_EQ(deck_error(lines({"[optimizer]", "eps = 0"})), "t.toml:2: optimizer.eps: must be > 0, got 0");
}

TEST(DeckErrors, NonFiniteAndOverflowingNumbers) {
  EXPECT_EQ(deck_error(lines({"[optimizer]", "weight_decay = inf"})),
            "t.toml:2: optimizer.weight_decay: must be a finite number, got inf");
  EXPECT_EQ(deck_error(lines({"[optimizer]", "lr = nan"})),
            "t.toml:2: optimizer.lr: must be a finite number, got nan");
  EXPECT_TRUE(starts_with(deck_error(lines({"[optimizer]", "lr = 1e999"})),
                          "t.toml:2: optimizer.lr: must be a finite number"));
  EXPECT_EQ(deck_error(lines({"[run]", "steps = 99999999999999999999"})),
            "t.toml:2: run.steps: does not fit in a 64-bit integer");
}

TEST(DeckErrors, BadChoiceAndEmptyName) {
  EXPECT_EQ(deck_error(lines({"[data]", "source = \"txt\""})),
            "t.toml:2: data.source: must be one of \"synthetic\", \"text\", \"tokens\", got \"txt\"");
  EXPECT_EQ(deck_error(lines({"[run]", "name = \"\""})), "t.toml:2: run.name: must not be empty");
  EXPECT_EQ(deck_error(lines({"[compute]", "device = \"cuda\"", "attention = \"flash\""})),
            "t.toml:3: compute.attention: must be one of \"auto\", \"cudnn\", \"pdtrain\", got "
            "\"flash\"");
}

TEST(DeckErrors, CrossKeyRulesNameTheLineToChange) {
  // d_model set in the file, n_head default: d_model's line.
  EXPECT_EQ(deck_error(lines({"[model]", "n_layer = 2", "d_model = 66"})),
            "t.toml:3: model.d_model: must be divisible by model.n_head (4), got 66");
  // Only n_head in the file: its line, even though d_model is the primary key of the rule.
  EXPECT_EQ(deck_error(lines({"[model]", "n_head = 5"})),
            "t.toml:2: model.n_head: must divide model.d_model (64), got 5");
  EXPECT_EQ(deck_error(lines({"[optimizer]", "lr = 1e-3", "min_lr = 1e-2"})),
            "t.toml:3: optimizer.min_lr: must be <= optimizer.lr (0.001), got 0.01");
  EXPECT_EQ(deck_error(lines({"[model]", "seq_len = 8"})),
            "t.toml:2: model.seq_len: must be > data.copy_lag (8) for the synthetic source, got 8");
  EXPECT_EQ(deck_error(lines({"[model]", "seq_len = 8", "[data]", "copy_lag = 9"})),
            "t.toml:4: data.copy_lag: must be < model.seq_len (8), got 9");
  EXPECT_EQ(deck_error(lines({"[model]", "padded_vocab_size = 32"})),
            "t.toml:2: model.padded_vocab_size: must be 0 or >= model.vocab_size (64), got 32");
  EXPECT_EQ(deck_error(lines({"[model]", "max_seq_len = 32"})),
            "t.toml:2: model.max_seq_len: must be 0 or >= model.seq_len (64), got 32");
  EXPECT_EQ(deck_error(lines({"[run]", "[data]", "source = \"text\""})),
            "t.toml:3: data.source: needs data.path (the file to read), got \"text\"");
  EXPECT_EQ(deck_error(lines({"[data]", "source = \"tokens\"", "path = \"\""})),
            "t.toml:3: data.path: must be set when data.source is \"tokens\"");
}

TEST(DeckErrors, SyntaxErrorsNameFileAndLine) {
  const std::string missing = deck_error(lines({"[run]", "steps = 5", "name = "}));
  EXPECT_TRUE(starts_with(missing, "t.toml:3: TOML syntax error: ")) << missing;
  const std::string twice = deck_error(lines({"[run]", "steps = 5", "", "steps = 6"}));
  EXPECT_TRUE(starts_with(twice, "t.toml:4: TOML syntax error: ")) << twice;
  const std::string table = deck_error(lines({"[run]", "[model]", "[run]"}));
  EXPECT_TRUE(starts_with(table, "t.toml:3: TOML syntax error: ")) << table;
  const std::string unclosed = deck_error(lines({"# deck", "[model"}));
  EXPECT_TRUE(starts_with(unclosed, "t.toml:2: TOML syntax error: ")) << unclosed;
}

// ---------------------------------------------------------------------------------- --set

TEST(DeckSet, OverridesApplyAfterTheFile) {
  const Deck d = parse(lines({"[model]", "n_layer = 4"}),
                       {"model.n_layer=6", "optimizer.lr = 0.01", "run.name=my run",
                        "data.val_path=\"v a l.bin\"", "data.source='synthetic'",
                        "optimizer.beta1=.5", "train.batch_size=1_024"});
  EXPECT_EQ(d.model.n_layer, 6);
  EXPECT_EQ(d.optimizer.lr, 0.01);
  EXPECT_EQ(d.run.name, "my run");
  EXPECT_EQ(d.run.out_dir, "runs/my run");
  EXPECT_EQ(d.data.val_path, "v a l.bin");
  EXPECT_EQ(d.optimizer.beta1, 0.5);
  EXPECT_EQ(d.train.batch_size, 1024);
  EXPECT_EQ(d.origin.at("model.n_layer"), "--set");
  EXPECT_EQ(d.origin.at("optimizer.lr"), "--set");
  EXPECT_EQ(d.origin.at("model.n_head"), "default");
  EXPECT_EQ(d.source_text, lines({"[model]", "n_layer = 4"}));  // the text before --set
}

TEST(DeckSet, LaterOverrideWins) {
  EXPECT_EQ(parse("", {"parallel.tp=2", "parallel.tp=4"}).parallel.tp, 4);
}

TEST(DeckSet, IntegerForFloatIsAccepted) {
  EXPECT_EQ(parse("", {"optimizer.grad_clip=2"}).optimizer.grad_clip, 2.0);
}

TEST(DeckSet, BadValues) {
  EXPECT_EQ(deck_error("", {"model.n_layer=abc"}), "--set model.n_layer=abc: expected an integer");
  EXPECT_EQ(deck_error("", {"model.n_layer=2.5"}),
            "--set model.n_layer=2.5: expected an integer, got a float (2.5)");
  EXPECT_EQ(deck_error("", {"model.n_layer="}), "--set model.n_layer=: expected an integer");
  EXPECT_EQ(deck_error("", {"optimizer.lr=fast"}), "--set optimizer.lr=fast: expected a number");
  EXPECT_EQ(deck_error("", {"optimizer.lr=1\nx=2"}), "--set optimizer.lr=1\nx=2: expected a number");
  EXPECT_EQ(deck_error("", {"optimizer.lr=-1"}), "--set optimizer.lr=-1: must be > 0, got -1");
  EXPECT_EQ(deck_error("", {"data.source=text2"}),
            "--set data.source=text2: must be one of \"synthetic\", \"text\", \"tokens\", got \"text2\"");
  EXPECT_EQ(deck_error("", {"run.name=\"unclosed"}), "--set run.name=\"unclosed: expected a string");
}

TEST(DeckSet, UnknownKeyAndMalformed) {
  EXPECT_EQ(deck_error("", {"model.n_layr=3"}),
            "--set model.n_layr=3: unknown key 'model.n_layr'; did you mean 'model.n_layer'?");
  EXPECT_EQ(deck_error("", {"optimiser.lr=3"}),
            "--set optimiser.lr=3: unknown key 'optimiser.lr'; did you mean 'optimizer.lr'?");
  EXPECT_EQ(deck_error("", {"model.n_layer"}), "--set model.n_layer: expected section.key=value");
  EXPECT_EQ(deck_error("", {"=3"}), "--set =3: expected section.key=value");
}

TEST(DeckSet, CrossRulesAreCheckedAfterOverrides) {
  // The file alone breaks copy_lag < seq_len; the override repairs it.
  const std::string bad = lines({"[model]", "seq_len = 4", "[data]", "copy_lag = 8"});
  EXPECT_EQ(parse(bad, {"data.copy_lag=2"}).data.copy_lag, 2);
  // A valid file broken by an override names the override.
  EXPECT_EQ(deck_error(lines({"[model]", "seq_len = 16"}), {"data.copy_lag=16"}),
            "--set data.copy_lag: must be < model.seq_len (16), got 16");
  EXPECT_EQ(deck_error(lines({"[data]", "copy_lag = 8"}), {"model.seq_len=8"}),
            "--set model.seq_len: must be > data.copy_lag (8) for the synthetic source, got 8");
  EXPECT_EQ(deck_error("", {"data.source=text"}),
            "--set data.source: needs data.path (the file to read), got \"text\"");
}

// ---------------------------------------------------------------------- where / resolved

TEST(DeckWhere, NamesFileLineSetOrDefault) {
  const Deck d = parse(lines({"[run]", "steps = 3", "[parallel]", "tp = 2"}), {"parallel.pp=2"});
  EXPECT_EQ(d.where("parallel.tp"), "t.toml:4: parallel.tp");
  EXPECT_EQ(d.where("parallel.pp"), "--set parallel.pp");
  EXPECT_EQ(d.where("parallel.dp"), "default value of parallel.dp");
  EXPECT_EQ(d.where("no.such"), "default value of no.such");
}

TEST(DeckResolved, RoundTripsToTheSameDeck) {
  std::vector<std::string> text = kFullDeck;
  text[2] = "name = \"a \\\"quoted\\\" \\\\ name\\twith tab and é\"";
  const Deck d = parse(lines(text), {"optimizer.lr=0.30000000000000004", "model.init_std=3",
                                     "optimizer.eps=1e-300", "data.copy_prob=0.1"});
  const std::string resolved = d.resolved_toml();
  const Deck back = parse_deck(resolved, "resolved.toml", {});
  EXPECT_TRUE(same_settings(d, back)) << resolved;
  EXPECT_EQ(back.optimizer.lr, 0.1 + 0.2);  // exact, not 0.3
  EXPECT_EQ(back.model.init_std, 3.0);
  EXPECT_EQ(back.run.name, d.run.name);
  EXPECT_NE(resolved.find("init_std = 3.0 "), std::string::npos) << resolved;  // a float
  EXPECT_NE(resolved.find("t.toml"), std::string::npos);  // header names the source
  // Every key is written, so the re-read deck has no defaults left.
  for (const auto& [key, from] : back.origin) EXPECT_NE(from, "default") << key;
  // And the resolved text is a fixed point once origins are equal.
  EXPECT_EQ(parse_deck(back.resolved_toml(), "resolved.toml", {}).resolved_toml(),
            back.resolved_toml());
}

TEST(DeckResolved, DefaultDeckRoundTrips) {
  const Deck d = parse("");
  const Deck back = parse(d.resolved_toml());
  EXPECT_TRUE(same_settings(d, back));
  EXPECT_EQ(back.run.out_dir, "runs/default");
}

TEST(DeckResolved, RandomFloatsRoundTripExactly) {
  // Bit-exact for awkward doubles: shortest representation must read back identically.
  const double values[] = {1e-300, 0.1, 1.0 / 3.0, 123456789.0, 2.5e-7, 0.999999999999};
  for (const double v : values) {
    Deck d = parse("");
    d.optimizer.weight_decay = v;
    const Deck back = parse(d.resolved_toml());
    EXPECT_EQ(back.optimizer.weight_decay, v) << d.resolved_toml();
  }
}

// --------------------------------------------------------------------------- load / docs

TEST(DeckLoad, ReadsAFileAndNamesItInOrigins) {
  const auto path = std::filesystem::temp_directory_path() / "pdtrain_test_deck.toml";
  std::ofstream(path) << lines({"[run]", "steps = 42"});
  const Deck d = load_deck(path.string(), {"run.seed=5"});
  EXPECT_EQ(d.run.steps, 42);
  EXPECT_EQ(d.run.seed, 5);
  EXPECT_EQ(d.source_name, path.string());
  EXPECT_EQ(d.where("run.steps"), path.string() + ":2: run.steps");
  std::filesystem::remove(path);
}

TEST(DeckLoad, ErrorsInAFileNameThePath) {
  const auto path = std::filesystem::temp_directory_path() / "pdtrain_test_bad_deck.toml";
  std::ofstream(path) << lines({"[run]", "stpes = 42"});
  try {
    load_deck(path.string(), {});
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              path.string() + ":2: unknown key 'run.stpes'; did you mean 'run.steps'?");
  }
  std::filesystem::remove(path);
}

TEST(DeckLoad, UnreadableFile) {
  try {
    load_deck("/nonexistent/deck.toml", {});
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ExitCode::deck);
    EXPECT_EQ(std::string(e.what()),
              "cannot read deck file '/nonexistent/deck.toml': No such file or directory");
  }
  try {
    load_deck(std::filesystem::temp_directory_path().string(), {});
    ADD_FAILURE() << "expected an error for a directory";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ExitCode::deck);
    EXPECT_TRUE(starts_with(e.what(), "cannot read deck file '")) << e.what();
  }
}

TEST(DeckDocs, ReferenceListsEveryKeyAndDocsMatch) {
  const std::string md = deck_reference_markdown();
  for (const auto& k : deck::schema()) EXPECT_NE(md.find("`" + k.key + "`"), std::string::npos) << k.key;
  EXPECT_NE(md.find("| `optimizer.lr` | float | `0.003` | > 0 |"), std::string::npos) << md;
  // docs/deck.md carries the generated reference verbatim; regenerate it when the schema changes.
  const std::string doc = read_file(PDTRAIN_SOURCE_DIR "/docs/deck.md");
  EXPECT_NE(doc.find(md), std::string::npos) << "docs/deck.md is out of date with the schema";
}

// ------------------------------------------------------------------------------- schema

TEST(DeckSchema, CoversEveryDeckField) {
  // 5 run + 9 model + 6 data + 9 parallel + 11 train + 3 compute + 8 optimizer + 13 pd +
  // 8 checkpoint + 2 output fields.
  EXPECT_EQ(deck::schema().size(), 74u);
  // Setting every key through the schema must change the struct: no two keys share a field.
  for (const auto& k : deck::schema()) {
    Deck d;
    const deck::Value before = k.get(d);
    deck::Value other = before;
    std::visit([](auto& v) {
      using T = std::decay_t<decltype(v)>;
      if constexpr (std::is_same_v<T, std::string>) v += "x";
      else if constexpr (std::is_same_v<T, bool>) v = !v;
      else v = v + 1;
    }, other);
    k.set(d, other);
    EXPECT_FALSE(same_settings(d, Deck{})) << k.key;
    for (const auto& j : deck::schema())
      if (j.key != k.key) EXPECT_EQ(j.get(d), j.get(Deck{})) << k.key << " also moved " << j.key;
  }
}

TEST(DeckSchema, EditDistanceAndSuggestions) {
  EXPECT_EQ(deck::edit_distance("n_layer", "n_layer"), 0u);
  EXPECT_EQ(deck::edit_distance("n_layr", "n_layer"), 1u);
  EXPECT_EQ(deck::edit_distance("n_lyaer", "n_layer"), 1u);  // adjacent swap
  EXPECT_EQ(deck::edit_distance("N_LAYER", "n_layer"), 0u);
  EXPECT_EQ(deck::suggest_key("model.nlayer"), "model.n_layer");
  EXPECT_EQ(deck::suggest_key("seq_len"), "model.seq_len");
  EXPECT_EQ(deck::suggest_key("model.x"), std::nullopt);
  EXPECT_EQ(deck::suggest_section("optimzer"), "optimizer");
  EXPECT_EQ(deck::suggest_section("zz"), std::nullopt);
}

}  // namespace
}  // namespace pdtrain
