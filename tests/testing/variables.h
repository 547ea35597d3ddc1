// SPDX-License-Identifier: Apache-2.0
// Variables made directly on a coordinator core, for tests that need one
// (core tests, and adapter tests over an in-process coordinator).
#ifndef REPVAR_TESTS_TESTING_VARIABLES_H_
#define REPVAR_TESTS_TESTING_VARIABLES_H_

#include <gtest/gtest.h>

#include <cstdint>
#include <optional>
#include <string>

#include "server/core/coordinator.h"
#include "tests/testing/status_matchers.h"

namespace repvar::testing {

// A zero-initialized `dtype`[2] variable of `replicas` replicas on `c`: its
// id (0 after a failed expectation).
inline uint64_t CreateZeroed(server::Coordinator& c, const std::string& name, Aggregation agg,
                             DType dtype = DType::kFloat32, int32_t replicas = 6) {
  VariableDef d;
  d.name = name;
  d.tensor = TensorSpec{dtype, {2}};
  d.replica_count = replicas;
  d.aggregation = agg;
  Initializer init;
  init.kind = InitializerKind::kZeros;
  auto created = c.CreateVariables({}, {{d, init}});
  EXPECT_OK(created);
  EXPECT_OK(c.Initialize({}, {{name, std::nullopt}}));
  return created.ok() ? created->variables[0].id : 0;
}

}  // namespace repvar::testing

#endif  // REPVAR_TESTS_TESTING_VARIABLES_H_
