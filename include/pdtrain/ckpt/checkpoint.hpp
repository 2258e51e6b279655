#pragma once
// HDF5 checkpoints of the holders' state: parameters and AdamW moments, one file per
// checkpoint, written collectively by the holders (compute ranks take no part). The format is
// described in docs/checkpoint-format.md.
//
// Writing: CheckpointWriter::write (synchronous) or write_async + poll/wait. A checkpoint is
// written to ckpt-<step>.h5.tmp, closed, fsync'ed, renamed to ckpt-<step>.h5, and only then
// named in <dir>/latest (written to a temporary and renamed), so a crash at any moment leaves
// every earlier checkpoint intact and `latest` naming a complete one.
//
// Reading: read_checkpoint for any assignment of blocks to holders (restart on another
// layout), find_latest_valid for restart, inspect for `pdtrain inspect`.
#include <mpi.h>

#include <climits>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "pdtrain/ckpt/codec.hpp"
#include "pdtrain/model/catalog.hpp"
#include "pdtrain/optim/adamw.hpp"

namespace pdtrain::ckpt {

// The root attributes of a checkpoint file.
struct CheckpointMeta {
  std::string path;                 // as opened
  std::int64_t format_version = 0;
  std::int64_t step = 0, version = 0, tokens_seen = 0;
  Codec codec = Codec::raw;         // the codec of this file (an anchor says "zstd" or "raw")
  std::string anchor;               // file name of the anchor (deltas only)
  std::uint32_t anchor_crc32c = 0;  // the anchor's params_crc32c (deltas only)
  std::uint32_t params_crc32c = 0;  // CRC32C of all decoded parameters in canonical order
  BitDeltaBits bits{};              // bitdelta files: the widths they were written with
  std::string deck, layout;
  ModelShape shape{};               // n_layer, n_head, d_model, vocab_size, padded_vocab, max_seq_len
  std::int64_t n_blocks = 0;
  bool complete = false;
  bool is_anchor() const { return !is_delta(codec); }
};

// What a holder gets back: its blocks, by id, and the metadata.
struct Checkpoint {
  CheckpointMeta meta;
  std::map<int, BlockState> blocks;
};

// The owned state a holder hands to the writer (pointers stay valid for the call).
using BlockRefs = std::map<int, const BlockState*>;

// What the last committed checkpoint cost (for logs and tests).
struct WriteStats {
  std::string path;
  Codec codec = Codec::raw;         // codec of the file written
  bool anchor = false;
  std::int64_t raw_bytes = 0;       // params + m + v as fp32, all holders
  std::int64_t file_bytes = 0;      // size of the .h5 file
  double encode_seconds = 0;        // this holder: snapshot encoding (background when async)
  double commit_seconds = 0;        // this holder: the collective write in the caller's thread
  std::int64_t precompressed_chunks = 0;  // this holder: chunks compressed in the background
  std::int64_t commit_compressed_chunks = 0;  // this holder: chunks compressed during commit
  std::vector<std::string> deleted;  // checkpoints removed by retention
};

class CheckpointWriter {
 public:
  // Collective over holders_comm (duplicated: the writer's collectives never mix with the
  // holders' own traffic). Every `anchor_every`-th checkpoint of a delta codec (xor, bitdelta),
  // and the first one this writer writes, is a full zstd anchor; raw and zstd checkpoints are
  // all full. keep > 0 keeps the newest `keep` checkpoints (plus the anchors they need) and
  // deletes older ones; keep = 0 deletes nothing. `bits`: the widths of bitdelta files
  // (params 1..8, moments 0 = lossless or 2..8; else Error(deck)).
  CheckpointWriter(MPI_Comm holders_comm, const ParamCatalog& catalog, Codec codec,
                   int anchor_every, std::string dir, int keep, int zstd_level = 3,
                   BitDeltaBits bits = {});
  ~CheckpointWriter();  // waits for a pending asynchronous checkpoint (collective then)
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  // Collective: writes this holder's blocks and returns the path of the checkpoint. Finishes
  // a pending asynchronous checkpoint first.
  std::string write(std::int64_t step, std::int64_t version, std::int64_t tokens_seen,
                    const std::string& deck_text, const std::string& layout_text,
                    const BlockRefs& blocks);

  // Collective: copies this holder's blocks (the only work done before returning) and encodes
  // and compresses them in a background thread that calls neither MPI nor HDF5. The collective
  // HDF5 write happens later in the caller's thread, in poll() or wait(). Returns the path the
  // checkpoint will have. Finishes a pending one first.
  std::string write_async(std::int64_t step, std::int64_t version, std::int64_t tokens_seen,
                          const std::string& deck_text, const std::string& layout_text,
                          const BlockRefs& blocks);
  // Collective, cheap: when every holder's background encoding has finished, writes the
  // pending checkpoint. Returns true when nothing is pending any more. Call it at a point every
  // holder reaches once per step (e.g. after the AdamW update).
  bool poll();
  // Collective: waits for the background encoding and writes the pending checkpoint.
  void wait();
  bool pending() const;

  const WriteStats& last_stats() const { return stats_; }
  Codec codec() const { return codec_; }

  // Opaque, defined in writer.cpp: a checkpoint in flight, this holder's anchor blocks, and
  // what the holders agree on before writing a file together.
  struct Job;
  struct Anchor;
  struct Agreed;

 private:
  std::string start(bool async, std::int64_t step, std::int64_t version, std::int64_t tokens,
                    const std::string& deck, const std::string& layout, const BlockRefs& blocks);
  // Writes and publishes the pending checkpoint: agree_before_writing() (writer.cpp), then:
  void commit();
  void write_file(const Job& j, const Agreed& agreed);
  void publish(const Job& j);

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
  const ParamCatalog& catalog_;
  Codec codec_;
  int anchor_every_, keep_, level_;
  std::string dir_;
  BitDeltaBits bits_;
  std::int64_t written_ = 0;          // checkpoints written by this writer
  std::shared_ptr<const Anchor> anchor_;  // this holder's blocks of the last anchor
  std::unique_ptr<Job> job_;          // the pending checkpoint, if any
  WriteStats stats_;
};

// Reads the blocks `block_ids` (this holder's; any assignment) of the checkpoint at `path`.
// Collective over holders_comm: every holder calls it, each with its own blocks. Verifies the
// format, `complete`, the model shape against `catalog`, every block's CRC32C (of the decoded
// fp32 data), and for deltas the anchor (found by file name in the same directory) and its
// CRC; when the holders' blocks together cover the model, also the canonical params CRC.
// Throws Error(ExitCode::data) naming the file, tensor and block on every holder alike.
Checkpoint read_checkpoint(const std::string& path, const ParamCatalog& catalog,
                           MPI_Comm holders_comm, const std::vector<int>& block_ids);

// Reads only the root attributes (no data, no verification beyond the format). Local.
CheckpointMeta read_meta(const std::string& path);

// Local: why the checkpoint at `path` cannot be used, naming the file ("" when it is complete,
// opens, fits its own model shape and every block decodes, against its anchor for a delta,
// with its CRC32C correct and every value finite). Reads the whole file.
std::string checkpoint_damage(const std::string& path);

struct LatestValid {
  std::string path;                   // "" when no checkpoint in `dir` verifies
  std::vector<std::string> warnings;  // one line per newer checkpoint skipped, naming it and why
};
// Local (call it on one holder and broadcast the path): the newest ckpt-*.h5 in `dir` of a
// step before `before_step` that is complete, opens and, with `verify_data`, decodes with every
// block's CRC correct and every value finite.
LatestValid find_latest_valid(const std::string& dir, bool verify_data = true,
                              std::int64_t before_step = INT64_MAX);

// Local: a human-readable description of a checkpoint: step, codec, anchor, model shape, each
// dataset's shape with stored and raw bytes, and the CRC status of every block.
// `intact` (if given) says whether the file is complete and every block verifies.
std::string inspect(const std::string& path, bool* intact = nullptr);

// The file name of the checkpoint of `step`: "ckpt-00000100.h5".
std::string checkpoint_file_name(std::int64_t step);

}  // namespace pdtrain::ckpt
