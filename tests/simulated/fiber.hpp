// Fibers for the warp simulator (warp_simulator.hpp): a simulated thread's
// context, made to start a function on a stack of its own, and the switch
// between two contexts. On x86-64 the switch is written by hand: six
// callee-saved registers, the stack pointer, MXCSR and the x87 control word.
// Elsewhere it is ucontext's swapcontext, which also saves the signal mask
// with a system call each time. The f32 attention test took 84 s with OS
// threads, 54 s with swapcontext and 4.5 s with the hand-written switch.
// (Build with -fcf-protection=none: the switch returns into another stack,
// which a CET shadow stack would refuse.)
#pragma once

#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

namespace loom_sim {

// A suspended fiber (or the scheduler): where to resume it.
#if defined(__x86_64__)
struct Context {
    void* stack_pointer = nullptr;
};
extern "C" void loom_sim_switch(void** save, void* load);
// Saves the caller's callee-saved registers, MXCSR and x87 control word on
// its stack, stores its stack pointer in *save, and resumes the context
// whose stack pointer is `load`. Weak: every test file that includes this
// header defines it, and the linker keeps one.
asm(R"(
    .pushsection .text
    .weak loom_sim_switch
    .type loom_sim_switch, @function
loom_sim_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    subq $8, %rsp
    stmxcsr (%rsp)
    fnstcw 4(%rsp)
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    ldmxcsr (%rsp)
    fldcw 4(%rsp)
    addq $8, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size loom_sim_switch, .-loom_sim_switch
    .popsection
)");
inline void switch_context(Context& save, const Context& load) {
    loom_sim_switch(&save.stack_pointer, load.stack_pointer);
}
// A context that starts `entry` (which must never return) on the stack
// [stack, stack + bytes): what loom_sim_switch pops, then entry as the
// return address, placed so that entry starts with the stack aligned as
// after a call (rsp = 8 mod 16).
inline void make_context(Context& context, char* stack, std::size_t bytes, void (*entry)()) {
    auto top = reinterpret_cast<std::uintptr_t>(stack + bytes) & ~std::uintptr_t{15};
    auto* frame = reinterpret_cast<std::uint64_t*>(top - 8 - 64);
    // The launching thread's MXCSR and x87 control word (rounding, exceptions),
    // as launch_each's threads have them.
    std::uint32_t mxcsr = 0;
    std::uint16_t control = 0;
    asm volatile("stmxcsr %0" : "=m"(mxcsr));
    asm volatile("fnstcw %0" : "=m"(control));
    frame[0] = mxcsr | (std::uint64_t{control} << 32);
    for (int r = 1; r <= 6; ++r) frame[r] = 0;  // r15, r14, r13, r12, rbx, rbp
    frame[7] = reinterpret_cast<std::uint64_t>(entry);
    frame[8] = 0;  // entry's return address: none, which ends a debugger's or unwinder's walk
    context.stack_pointer = frame;
}
#else
struct Context {
    ucontext_t state{};
};
inline void switch_context(Context& save, const Context& load) { swapcontext(&save.state, &load.state); }
inline void make_context(Context& context, char* stack, std::size_t bytes, void (*entry)()) {
    getcontext(&context.state);
    context.state.uc_stack.ss_sp = stack;
    context.state.uc_stack.ss_size = bytes;
    context.state.uc_link = nullptr;
    makecontext(&context.state, entry, 0);
}
#endif

// Stacks for `count` fibers of at least `bytes` each, every one above a page
// that may not be touched: a fiber that overflows its stack faults at once
// instead of silently overwriting its neighbour's stack or the heap.
class FiberStacks {
public:
    FiberStacks(int count, std::size_t bytes)
        : page_(static_cast<std::size_t>(sysconf(_SC_PAGESIZE))),
          bytes_((bytes + page_ - 1) / page_ * page_),
          size_((bytes_ + page_) * static_cast<std::size_t>(count)) {
        void* base = mmap(nullptr, size_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (base == MAP_FAILED) {
            std::perror("warp_simulator: mmap of the fiber stacks");
            std::abort();
        }
        base_ = static_cast<char*>(base);
        for (int i = 0; i < count; ++i)
            if (mprotect(base_ + static_cast<std::size_t>(i) * (bytes_ + page_), page_, PROT_NONE) != 0) {
                std::perror("warp_simulator: mprotect of a fiber stack's guard page");
                std::abort();
            }
    }
    FiberStacks(const FiberStacks&) = delete;
    FiberStacks& operator=(const FiberStacks&) = delete;
    ~FiberStacks() { munmap(base_, size_); }

    [[nodiscard]] char* stack(int i) const { return base_ + static_cast<std::size_t>(i) * (bytes_ + page_) + page_; }
    [[nodiscard]] std::size_t bytes() const { return bytes_; }

private:
    std::size_t page_, bytes_, size_;
    char* base_ = nullptr;
};

}  // namespace loom_sim
