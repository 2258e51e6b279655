// io/output_file and the metrics file: a write that fails names the file, and loses nothing
// already written. /dev/full stands for a full disk (every write fails with ENOSPC); a
// PATH.tmp that links to it makes the temporary of a rewrite fail.
#include "pdtrain/io/output_file.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "pdtrain/core/error.hpp"
#include "pdtrain/io/metrics.hpp"

#include "../support/scratch_dir.hpp"

namespace pdtrain {
namespace {

namespace fs = std::filesystem;


std::string read(const fs::path& p) {
  std::ifstream in(p);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// The message of the Error(data) that `f` throws; fails the test if it throws none.
template <class F>
std::string data_error(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ExitCode::data);
    return e.what();
  }
  ADD_FAILURE() << "no error";
  return "";
}

TEST(OutputFile, WriteOnAFullDiskNamesThePathAndTheCause) {
  OutputFile f("/dev/full", OutputFile::Mode::truncate);
  EXPECT_EQ(data_error([&] { f.write("row\n"); }),
            "cannot write /dev/full: No space left on device");
}

TEST(OutputFile, AtomicWriteThatFailsLeavesTheOriginalAndNoTemporary) {
  ScratchDir d;
  const fs::path file = d / "deck.resolved.toml", tmp = file.string() + ".tmp";
  std::ofstream(file) << "old\n";
  fs::create_symlink("/dev/full", tmp);
  EXPECT_EQ(data_error([&] { write_file_atomically(file.string(), "new\n"); }),
            "cannot write " + tmp.string() + ": No space left on device");
  EXPECT_EQ(read(file), "old\n");
  EXPECT_FALSE(fs::exists(fs::symlink_status(tmp)));
  write_file_atomically(file.string(), "new\n");
  EXPECT_EQ(read(file), "new\n");
}

const char* kHeader =
    "step,loss,val_loss,lr,grad_norm,tokens_per_s,step_ms,fetch_ms,compute_ms,reduce_ms,push_ms,"
    "bubble\n";

std::string rows(int from, int to) {
  std::string s;
  for (int k = from; k <= to; ++k) s += std::to_string(k) + ",1,,1,1,1,1,1,1,1,1,0\n";
  return s;
}

TEST(MetricsWriter, RestartTrimThatCannotBeWrittenKeepsEveryRow) {
  ScratchDir d;
  const fs::path file = d / "metrics.csv";
  const std::string before = kHeader + rows(1, 300);
  std::ofstream(file) << before;
  fs::create_symlink("/dev/full", d / "metrics.csv.tmp");
  EXPECT_EQ(data_error([&] { MetricsWriter(file.string(), 97); }),
            "cannot write " + file.string() + ".tmp: No space left on device");
  EXPECT_EQ(read(file), before);
}

TEST(MetricsWriter, RestartKeepsTheRowsUpToItsCheckpointAndDropsARowCutShort) {
  ScratchDir d;
  const fs::path file = d / "metrics.csv";
  std::ofstream(file) << kHeader + rows(1, 5) + "6,1.2";  // the last row cut mid-line
  {
    MetricsWriter m(file.string(), 3);
    StepRecord r;
    r.step = 4;
    m.append(r);
    m.close();
  }
  const std::string got = read(file), kept = kHeader + rows(1, 3);
  ASSERT_EQ(got.substr(0, kept.size()), kept);
  const std::string appended = got.substr(kept.size());  // step 4's row, whole, and nothing else
  EXPECT_EQ(appended.rfind("4,", 0), 0u) << appended;
  EXPECT_EQ(std::count(appended.begin(), appended.end(), '\n'), 1) << appended;
  EXPECT_EQ(appended.back(), '\n');
}

TEST(MetricsWriter, RestartWithNothingToTrimDoesNotRewrite) {
  ScratchDir d;  // a full disk must not stop a restart whose rows are all kept
  const fs::path file = d / "metrics.csv";
  std::ofstream(file) << kHeader + rows(1, 3);
  fs::create_symlink("/dev/full", d / "metrics.csv.tmp");
  MetricsWriter m(file.string(), 3);
  EXPECT_EQ(read(file), kHeader + rows(1, 3));
}

}  // namespace
}  // namespace pdtrain
