// Stands in for torch's Python binding of an allocation, so tests/test_torch_oom.py can see on a CPU what Python
// receives when the torch bridge fails an allocation: the hook is called as CUDAPluggableAllocator calls it, and the
// C++ error it throws goes through torch::translate_exception_to_python, the function behind torch's
// END_HANDLE_TH_ERRORS (torch/csrc/Exceptions.h), which sets the Python exception. Called through ctypes.PyDLL with
// a py_object result, so that exception is raised in the caller. Linked to the installed libtorch_python; no header
// of torch is needed (the one declaration below is the exported function's).
#include <cstddef>
#include <cstdint>
#include <exception>

namespace torch {
void translate_exception_to_python(const std::exception_ptr&);
}

using AllocFn = void* (*)(size_t, int, void*);

extern "C" {
// NULL with the Python exception set where the hook threw; else the pointer, as a Python int would be (unused).
void* harness_torch_alloc(uintptr_t hook, size_t size, int device) {
    try {
        reinterpret_cast<AllocFn>(hook)(size, device, nullptr);
    } catch (...) {
        torch::translate_exception_to_python(std::current_exception());
        return nullptr;
    }
    return nullptr;
}
}
