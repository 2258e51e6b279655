// io/run_lock: one run per directory; a dead run's lock is taken over, a live one's refused.
#include "pdtrain/io/run_lock.hpp"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "pdtrain/core/error.hpp"

#include "../support/scratch_dir.hpp"

namespace pdtrain {
namespace {

namespace fs = std::filesystem;


std::string host() {
  char name[256] = {0};
  gethostname(name, sizeof(name) - 1);
  return name;
}

std::string boot() {
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::string id;
  in >> id;
  return id;
}

void write_lock_file(const ScratchDir& d, const std::string& line) {
  std::ofstream(d / "pdtrain.lock") << line << "\n";
}

// The message of the Error that acquiring throws ("" if it does not throw).
std::string refusal(const ScratchDir& d) {
  std::string notice;
  try {
    RunLock::acquire(d.path(), "run.out_dir", &notice);
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ExitCode::data);
    return e.what();
  }
  return "";
}

TEST(RunLock, ASecondLockOnTheDirectoryIsRefusedNamingHostAndPid) {
  ScratchDir d;
  std::string notice;
  auto held = RunLock::acquire(d.path(), "run.out_dir", &notice);
  EXPECT_EQ(notice, "");
  EXPECT_NE(refusal(d).find("run.out_dir " + d.path() + " is in use by another run: host " + host() +
                            ", pid " + std::to_string(getpid())),
            std::string::npos)
      << refusal(d);
}

TEST(RunLock, ReleasedLockIsFreeWithoutNotice) {
  ScratchDir d;
  std::string notice;
  RunLock::acquire(d.path(), "run.out_dir", &notice).reset();
  auto again = RunLock::acquire(d.path(), "run.out_dir", &notice);
  EXPECT_EQ(notice, "");
}

TEST(RunLock, LockOfAKilledProcessIsTakenOverWithANotice) {
  ScratchDir d;
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {  // holds the lock until killed
    std::string notice;
    auto lock = RunLock::acquire(d.path(), "run.out_dir", &notice);
    (void)!write(ready[1], "x", 1);
    for (;;) pause();
  }
  char c;
  ASSERT_EQ(read(ready[0], &c, 1), 1);
  const std::string pid = std::to_string(child);
  EXPECT_NE(refusal(d).find("host " + host() + ", pid " + pid), std::string::npos) << refusal(d);
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  std::string notice;
  auto lock = RunLock::acquire(d.path(), "run.out_dir", &notice);
  EXPECT_NE(notice.find("taking over the lock of a run that is gone (host " + host() + ", pid " + pid),
            std::string::npos) << notice;
  EXPECT_NE(notice.find("that process no longer runs"), std::string::npos) << notice;
}

TEST(RunLock, LockOfADeadProcessNotYetReapedIsTakenOver) {
  ScratchDir d;  // a killed rank is a zombie until its parent reaps it; its lock is gone
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    std::string notice;
    RunLock::acquire(d.path(), "run.out_dir", &notice).release();  // dies holding it
    _exit(0);
  }
  siginfo_t info{};
  ASSERT_EQ(waitid(P_PID, child, &info, WEXITED | WNOWAIT), 0);  // exited, still a zombie
  std::string notice;
  auto lock = RunLock::acquire(d.path(), "run.out_dir", &notice);
  EXPECT_NE(notice.find("pid " + std::to_string(child)), std::string::npos) << notice;
  EXPECT_NE(notice.find("that process no longer runs"), std::string::npos) << notice;
  waitpid(child, nullptr, 0);
}

TEST(RunLock, LockOfAnotherHostWhoseFcntlLockIsGoneIsTakenOver) {
  ScratchDir d;
  write_lock_file(d, "host=elsewhere pid=4242 start=7 boot=b job=991 since=2026-01-01T00:00:00Z");
  std::string notice;
  auto lock = RunLock::acquire(d.path(), "run.out_dir", &notice);
  EXPECT_NE(notice.find("host elsewhere, pid 4242 (Slurm job 991)"), std::string::npos) << notice;
  EXPECT_NE(notice.find("its lock vanished with its process"), std::string::npos) << notice;
}

TEST(RunLock, LiveProcessOfThisHostIsRefusedEvenWithoutItsFcntlLock) {
  ScratchDir d;  // a file system that did not keep the lock: the PID still runs, same start
  write_lock_file(d, "host=" + host() + " pid=" + std::to_string(getppid()) + " start=0 boot=" +
                         boot() + " job=- since=x");
  const std::string why = refusal(d);
  EXPECT_NE(why.find("pid " + std::to_string(getppid())), std::string::npos) << why;
  EXPECT_NE(why.find("it still runs on this host"), std::string::npos) << why;
}

TEST(RunLock, PidReusedByAProcessStartedLaterIsDead) {
  ScratchDir d;
  write_lock_file(d, "host=" + host() + " pid=" + std::to_string(getppid()) + " start=1 boot=" +
                         boot() + " job=- since=x");
  std::string notice;
  auto lock = RunLock::acquire(d.path(), "run.out_dir", &notice);
  EXPECT_NE(notice.find("that process no longer runs"), std::string::npos) << notice;
}

TEST(RunLock, LockFromAnEarlierBootIsDead) {
  ScratchDir d;
  write_lock_file(d, "host=" + host() + " pid=" + std::to_string(getppid()) +
                         " start=0 boot=another-boot job=- since=x");
  std::string notice;
  auto lock = RunLock::acquire(d.path(), "run.out_dir", &notice);
  EXPECT_NE(notice.find("this host has rebooted since"), std::string::npos) << notice;
}

TEST(RunLock, UnwritableDirectoryIsAnErrorNamingTheLockFile) {
  std::string notice;
  try {
    RunLock::acquire("/nonexistent/out", "run.out_dir", &notice);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ExitCode::data);
    EXPECT_NE(std::string(e.what()).find("/nonexistent/out/pdtrain.lock"), std::string::npos);
  }
}

}  // namespace
}  // namespace pdtrain
