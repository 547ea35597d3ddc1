// SPDX-License-Identifier: Apache-2.0
// A call made with bytes: any method of any kind (a unary call is a stream
// of one message each way), its messages sent as they are and its answers
// returned as the bytes on the wire. For tests that send what a generated
// stub would not.
#ifndef REPVAR_TESTS_TESTING_RAW_CALL_H_
#define REPVAR_TESTS_TESTING_RAW_CALL_H_

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <utility>
#include <vector>

namespace repvar::testing {

// Sends `messages` (wire bytes) on `method` ("/repvar.v1.Service/Method") at
// `address`, then reads every answer; returns the call's status and the
// answers' bytes.
inline std::pair<grpc::Status, std::vector<std::string>> RawCall(
    const std::string& address, const std::string& method,
    const std::vector<std::string>& messages) {
  grpc::GenericStub generic(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  grpc::CompletionQueue cq;
  intptr_t tag = 1;
  auto next = [&cq, &tag]() {
    void* got = nullptr;
    bool ok = false;
    EXPECT_TRUE(cq.Next(&got, &ok));
    EXPECT_EQ(reinterpret_cast<intptr_t>(got), tag);
    return ok;
  };
  auto call = generic.PrepareCall(&ctx, method, &cq);
  call->StartCall(reinterpret_cast<void*>(tag));
  EXPECT_TRUE(next());
  for (const std::string& m : messages) {
    grpc::Slice slice(m);
    grpc::ByteBuffer buffer(&slice, 1);
    call->Write(buffer, reinterpret_cast<void*>(++tag));
    if (!next()) break;
  }
  call->WritesDone(reinterpret_cast<void*>(++tag));
  next();
  std::vector<std::string> answers;
  grpc::ByteBuffer answer;
  while (true) {
    call->Read(&answer, reinterpret_cast<void*>(++tag));
    if (!next()) break;
    std::vector<grpc::Slice> slices;
    EXPECT_TRUE(answer.Dump(&slices).ok());
    answers.emplace_back();
    for (const grpc::Slice& piece : slices) {
      answers.back().append(reinterpret_cast<const char*>(piece.begin()), piece.size());
    }
  }
  grpc::Status finished;
  call->Finish(&finished, reinterpret_cast<void*>(++tag));
  next();
  return {finished, answers};
}

}  // namespace repvar::testing

#endif  // REPVAR_TESTS_TESTING_RAW_CALL_H_
