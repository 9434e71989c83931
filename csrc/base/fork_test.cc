#include "csrc/base/fork.h"

#include <sys/wait.h>
#include <unistd.h>

#include "gtest/gtest.h"

namespace pw {
namespace {

// Exit code of a forked child that reports InForkedChild().
int ChildSees() {
  const pid_t pid = fork();
  if (pid == 0) _exit(InForkedChild() ? 1 : 0);
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

TEST(ForkTest, ChildIsMarkedOnlyAfterWatching) {
  EXPECT_FALSE(InForkedChild());
  EXPECT_EQ(ChildSees(), 0);  // not watching yet
  WatchForFork();
  WatchForFork();  // idempotent
  EXPECT_EQ(ChildSees(), 1);
  EXPECT_FALSE(InForkedChild());  // the parent is not a child
}

}  // namespace
}  // namespace pw
