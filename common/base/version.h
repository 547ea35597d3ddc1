// SPDX-License-Identifier: Apache-2.0
// What was built: the project's version, the git commit of the source tree
// ("-dirty" when it had uncommitted changes; "unknown" without git) and the
// CMake build type. Written at every build (cmake/version.cmake).
#ifndef REPVAR_COMMON_BASE_VERSION_H_
#define REPVAR_COMMON_BASE_VERSION_H_

namespace repvar {

extern const char* const kVersion;
extern const char* const kGitCommit;
extern const char* const kBuildType;

}  // namespace repvar

#endif  // REPVAR_COMMON_BASE_VERSION_H_
