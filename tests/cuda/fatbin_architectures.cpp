// fatbin_architectures BINARY ARCH...: exits 0 only if BINARY embeds device
// code (a cubin, not only PTX) for every listed SM architecture, e.g. 90 80.
// Reads the .nv_fatbin ELF section directly, so the check needs no cuobjdump
// (which the toolkit here does not ship).
//
// Fatbin layout (as written by nvcc's fatbinary tool): containers, each a
// 16-byte header {u32 magic 0xBA55ED50, u16 version, u16 header size, u64
// payload size} followed by entries, each {u16 kind (1 PTX, 2 ELF), u16
// version, u32 header size, u64 payload size, ..., u32 arch at offset 28}.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <elf.h>
#include <fstream>
#include <iterator>
#include <set>
#include <string>
#include <vector>

namespace {

// True when [offset, offset + length) lies inside `size` bytes, without overflow.
bool in_range(std::uint64_t offset, std::uint64_t length, std::uint64_t size) {
    return offset <= size && length <= size - offset;
}

[[noreturn]] void malformed(const char* what, std::uint64_t offset) {
    std::fprintf(stderr, "fatbin_architectures: malformed input: %s at offset %llu\n", what,
                 static_cast<unsigned long long>(offset));
    std::exit(2);
}

template <class T>
T read_at(const std::vector<unsigned char>& bytes, std::uint64_t offset) {
    if (!in_range(offset, sizeof(T), bytes.size())) malformed("truncated data", offset);
    T value{};
    std::memcpy(&value, bytes.data() + offset, sizeof(T));
    return value;
}

}  // namespace

int main(int argc, char** argv) {
    if (argc < 3) {
        std::fprintf(stderr, "usage: fatbin_architectures BINARY ARCH...\n");
        return 2;
    }
    std::ifstream in(argv[1], std::ios::binary);
    const std::vector<unsigned char> file((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (file.size() < sizeof(Elf64_Ehdr) || std::memcmp(file.data(), ELFMAG, SELFMAG) != 0) {
        std::fprintf(stderr, "fatbin_architectures: %s is not an ELF file\n", argv[1]);
        return 2;
    }
    const auto header = read_at<Elf64_Ehdr>(file, 0);
    if (header.e_ident[EI_CLASS] != ELFCLASS64 || header.e_shentsize < sizeof(Elf64_Shdr) ||
        header.e_shstrndx >= header.e_shnum ||
        !in_range(header.e_shoff, std::uint64_t{header.e_shnum} * header.e_shentsize, file.size()))
        malformed("ELF header", 0);
    const auto names = read_at<Elf64_Shdr>(file, header.e_shoff + std::uint64_t{header.e_shstrndx} * header.e_shentsize);
    if (!in_range(names.sh_offset, names.sh_size, file.size())) malformed("section name table", names.sh_offset);
    constexpr char wanted[] = ".nv_fatbin";
    std::vector<unsigned char> fatbin;
    for (unsigned i = 0; i < header.e_shnum; ++i) {
        const auto section = read_at<Elf64_Shdr>(file, header.e_shoff + std::uint64_t{i} * header.e_shentsize);
        if (!in_range(section.sh_name, sizeof(wanted), names.sh_size)) continue;
        if (std::memcmp(file.data() + names.sh_offset + section.sh_name, wanted, sizeof(wanted)) != 0) continue;
        if (!in_range(section.sh_offset, section.sh_size, file.size())) malformed(".nv_fatbin section", section.sh_offset);
        fatbin.assign(file.begin() + static_cast<long>(section.sh_offset),
                      file.begin() + static_cast<long>(section.sh_offset + section.sh_size));
    }
    if (fatbin.empty()) {
        std::fprintf(stderr, "fatbin_architectures: %s has no .nv_fatbin section: no device code\n", argv[1]);
        return 1;
    }

    std::set<unsigned> cubins, ptx;
    std::uint64_t at = 0;
    while (in_range(at, 16, fatbin.size())) {
        if (read_at<std::uint32_t>(fatbin, at) != 0xBA55ED50u) {
            at += 8;  // containers are 8-byte aligned; skip padding between them
            continue;
        }
        const auto container_header = read_at<std::uint16_t>(fatbin, at + 6);
        const auto container_size = read_at<std::uint64_t>(fatbin, at + 8);
        // Every step below advances by at least one header, so the walk ends.
        if (container_header < 16 || !in_range(at + container_header, container_size, fatbin.size()))
            malformed("fatbin container", at);
        std::uint64_t entry = at + container_header;
        const std::uint64_t end = entry + container_size;
        while (in_range(entry, 32, end)) {
            const auto kind = read_at<std::uint16_t>(fatbin, entry);
            const auto entry_header = read_at<std::uint32_t>(fatbin, entry + 4);
            const auto payload = read_at<std::uint64_t>(fatbin, entry + 8);
            const auto arch = read_at<std::uint32_t>(fatbin, entry + 28);
            if (entry_header < 32 || !in_range(entry, std::uint64_t{entry_header}, end) ||
                !in_range(entry + entry_header, payload, end))
                malformed("fatbin entry", entry);
            (kind == 2 ? cubins : ptx).insert(arch);
            entry += entry_header + payload;
        }
        at = end;
    }
    std::printf("device code in %s:", argv[1]);
    for (unsigned a : cubins) std::printf(" sm_%u", a);
    for (unsigned a : ptx) std::printf(" compute_%u(ptx)", a);
    std::printf("\n");
    int missing = 0;
    for (int i = 2; i < argc; ++i) {
        const auto want = static_cast<unsigned>(std::strtoul(argv[i], nullptr, 10));
        if (!cubins.count(want)) {
            std::printf("missing: no cubin for sm_%u\n", want);
            ++missing;
        }
    }
    return missing == 0 ? 0 : 1;
}
