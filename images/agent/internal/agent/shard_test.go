// Copyright The service-with-healthchecks Authors.
// SPDX-License-Identifier: Apache-2.0

package agent_test

// The package's tests spend their time waiting (probe periods, graces, API freezes: about 210 s
// of which 27 s are CPU, development/BENCHMARKS-HISTORY.md, "`make test`: the agent's tests in
// two processes"). A plain run of the package therefore runs as two processes side by side
// (testkit/shard), each its own isolated binary with its own cluster: the tests that run the
// controller program (liveness, the probe budget's report: they freeze the API server or wait
// out graces), with two of the longest others to even the halves out, in one, every other test
// in the other. `-skip '^$'` runs the package in one process (it skips nothing).
const shardEnv = "SWH_AGENT_TEST_SHARD"

// controllerTests matches the tests of the controller shard: those that run the controller
// program (about 85 s) and two of the longest others (about 23 s), so that both shards take
// about 105 s.
const controllerTests = `^(TestAStoppedAgentsEndpointsAreWithdrawnAfterTheGraceAndReturnWithIt` +
	`|TestAnAPIOutageWithdrawsNothingAndTheAgentsPublishAfterIt` +
	`|TestMoreThanHalfOfTheAgentsStoppedAtOnceWithdrawsNothingAndTheGuardSaysWhy` +
	`|TestALeaderThatLosesItsLeaseInAnAPIFreezeRestartsAndWithdrawsNothing` +
	`|TestBudgetOverBudgetNamespaceIsReportedAndTheVictimIsServed` +
	`|TestReadinessEventsAreRateLimitedPerPod` +
	`|TestARestartedAgentAdoptsItsSlicesWithoutFlapping)$`
