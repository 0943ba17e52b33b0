// The torch bridge's one piece of C++: turning an allocation failure into an exception torch reports with our text.
#pragma once
#include <stdexcept>

namespace gmlake {
// Thrown through torch's allocator call; torch turns std::exception into a Python RuntimeError with this message.
[[noreturn]] inline void throw_error(const char* message) { throw std::runtime_error(message); }
}  // namespace gmlake
