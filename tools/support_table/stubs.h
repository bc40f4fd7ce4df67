// The rows of the tensor-core engine's kernel table (tc/generated/table.inc, which tc/dispatch.cu's
// table holds in the same order), instantiated with stubs.cu's launchers: CudaPlan::kernel indexes
// them.
#pragma once

#include "tc/launch.h"

namespace fusedattn {
namespace tc {

enum class Dir { kFwd, kBwd };
struct StubRow {
  Dir dir;
  DType dtype;
  int head_dim;
  Variant variant;
  KernelFn fn;
};
extern const StubRow kStubRows[];

}  // namespace tc
}  // namespace fusedattn
