// Throws PyTorch's own out-of-memory error, c10::OutOfMemoryError, for the torch bridge (Note [Torch's
// out-of-memory type] in gmlake/torch/_torch_oom.py). Built by gmlake/torch/_torch_oom.py against the installed torch's headers
// and its libc10, never by setup.py: it needs c10/util/Exception.h, which needs no CUDA, so gmlake's one build keeps
// serving CUDA 12 and CUDA 13.
#include <c10/util/Exception.h>

#include <string>

extern "C" {
// What the shim was built against, so a library left in the cache by another torch is never used.
const char* gmlake_torch_oom_version() { return GMLAKE_TORCH_VERSION; }

// Not noexcept: the error travels through the bridge and torch's allocator call to torch's Python binding, which
// turns c10::OutOfMemoryError into torch.OutOfMemoryError, as it does for its own allocator's.
[[noreturn]] void gmlake_throw_torch_oom(const char* message) {
    throw c10::OutOfMemoryError(c10::SourceLocation{__func__, __FILE__, static_cast<uint32_t>(__LINE__)},
                                std::string(message));
}
}
