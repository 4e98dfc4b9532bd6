// DeployTxn (syrupd/deploy_txn.h) as pure logic: the undo stack's order, what runs when
// each step fails, commit and hand-over, and the fault points of test builds.
#include <gtest/gtest.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "deploy_txn.h"

namespace syrup {
namespace {

using Step = DeployTxn::Step;
constexpr Step kSteps[] = {Step::kCompile, Step::kLoad, Step::kInstall, Step::kRegister, Step::kRetire};

// A deploy of the five steps, each pushing one undo (retire, irreversible, pushes none),
// that fails at `failing` (or at none): the undo steps that ran, in the order they ran.
std::vector<std::string> run(std::optional<Step> failing, bool* completed = nullptr) {
  std::vector<std::string> ran;
  {
    DeployTxn txn;
    bool ok = true;
    for (Step s : kSteps) {
      if (s != Step::kRetire)
        txn.on_undo(DeployTxn::step_name(s), [&ran, s] { ran.push_back(DeployTxn::step_name(s)); });
      if (failing == s) {
        ok = false;
        break;
      }
    }
    if (ok) txn.commit();
    if (completed) *completed = ok;
  }
  return ran;
}

TEST(DeployTxnUnit, EachStepFailingUndoesItAndTheStepsBeforeNewestFirst) {
  EXPECT_EQ(run(Step::kCompile), (std::vector<std::string>{"compile"}));
  EXPECT_EQ(run(Step::kLoad), (std::vector<std::string>{"load", "compile"}));
  EXPECT_EQ(run(Step::kInstall), (std::vector<std::string>{"install", "load", "compile"}));
  EXPECT_EQ(run(Step::kRegister), (std::vector<std::string>{"register", "install", "load", "compile"}));
  EXPECT_EQ(run(Step::kRetire), (std::vector<std::string>{"register", "install", "load", "compile"}));
}

TEST(DeployTxnUnit, ACommittedDeployUndoesNothing) {
  bool completed = false;
  EXPECT_TRUE(run(std::nullopt, &completed).empty());
  EXPECT_TRUE(completed);
}

TEST(DeployTxnUnit, ExplicitRollbackRunsEachUndoOnceAndReportsThem) {
  int runs = 0;
  DeployTxn txn;
  txn.on_undo("a", [&] { runs++; });
  txn.on_undo("b", [&] { runs += 10; });
  EXPECT_EQ(txn.pending(), 2u);
  EXPECT_EQ(txn.rollback(), (std::vector<std::string>{"b", "a"}));
  EXPECT_EQ(runs, 11);
  EXPECT_EQ(txn.pending(), 0u);
  EXPECT_TRUE(txn.rollback().empty());  // the destructor's, too
  EXPECT_EQ(runs, 11);
}

TEST(DeployTxnUnit, AHandedOverDeployLeavesWhatItDidToTheParkedOne) {
  bool undone = false;
  {
    DeployTxn txn;
    txn.on_undo("application entry", [&] { undone = true; });
    txn.hand_over();
  }
  EXPECT_FALSE(undone);
}

// An undo pushed while unwinding (a hook's undo that itself changes something) runs too,
// after the one that pushed it, before the older ones.
TEST(DeployTxnUnit, AnUndoPushedDuringTheUnwindRunsBeforeOlderOnes) {
  std::vector<std::string> ran;
  DeployTxn txn;
  txn.on_undo("old", [&] { ran.push_back("old"); });
  txn.on_undo("pushes", [&] {
    ran.push_back("pushes");
    txn.on_undo("pushed", [&] { ran.push_back("pushed"); });
  });
  txn.rollback();
  EXPECT_EQ(ran, (std::vector<std::string>{"pushes", "pushed", "old"}));
}

// What an undo captured is released when it has run: a socket or a hook's root is not
// held by a finished transaction.
TEST(DeployTxnUnit, AnUndoIsDestroyedOnceRunOrCommitted) {
  auto held = std::make_shared<int>(1);
  std::weak_ptr<int> w = held;
  {
    DeployTxn txn;
    txn.on_undo("holds", [h = std::move(held)] {});
    EXPECT_FALSE(w.expired());
    txn.commit();
    EXPECT_TRUE(w.expired());
  }
}

TEST(DeployTxnUnit, FaultPointsFireOnlyInTestBuildsForTheNamedStepAndPolicy) {
  std::string err;
  if (!DeployTxn::fault_injection_built()) {
    EXPECT_EQ(DeployTxn::set_fault("load:p.c", err), 0);
    for (Step s : kSteps) EXPECT_EQ(DeployTxn(std::string("p.c")).fault(s, err), 0);
    GTEST_SKIP() << "built without SYRUP_FAULT_INJECTION: fault points never fire (checked); the rest needs it";
  }
  EXPECT_EQ(DeployTxn::set_fault("bogus:p.c", err), -EINVAL);
  EXPECT_NE(err.find("'bogus:p.c'"), std::string::npos) << err;
  EXPECT_EQ(DeployTxn::set_fault("load:", err), -EINVAL);
  ASSERT_EQ(DeployTxn::set_fault("install:p.c,retire:q.c", err), 0) << err;
  DeployTxn p("p.c"), q("q.c"), other("r.c");
  for (Step s : kSteps) {
    err.clear();
    EXPECT_EQ(p.fault(s, err), s == Step::kInstall ? -EIO : 0) << DeployTxn::step_name(s);
    EXPECT_EQ(q.fault(s, err), s == Step::kRetire ? -EIO : 0) << DeployTxn::step_name(s);
    EXPECT_EQ(other.fault(s, err), 0);
  }
  EXPECT_EQ(p.fault(Step::kInstall, err), -EIO);
  EXPECT_EQ(err, "injected fault at the install step of policy p.c (SYRUP_FAULT_STEP)");
  EXPECT_EQ(DeployTxn::set_fault("", err), 0);
  EXPECT_EQ(p.fault(Step::kInstall, err), 0);
}

}  // namespace
}  // namespace syrup
