#if canImport(Glibc)
import Glibc
#endif

/// The C library's allocator, for processes that allocate and free the same large buffers over and over.
public enum Allocator {
    /// Keeps allocations of up to `mmapThreshold` bytes on the heap rather than in mappings of their own, and up to
    /// `trimThreshold` bytes of free heap top rather than returning them at every free.
    ///
    /// glibc maps every allocation over 128 KiB afresh and unmaps it when freed (it raises that threshold only after
    /// such a block is freed, up to 32 MiB), so each of a simulated fleet's 800 KB models, reports and diffs costs
    /// page faults and zero-filled pages in the kernel: a fleet's system time fell by about 40 % with the settings.
    /// Setting them also turns off glibc's adjustment, so a run behaves the same whatever it freed first.
    /// - Returns: Whether the settings took (glibc; elsewhere nothing changes).
    @discardableResult
    public static func keepLargeBuffersOnHeap(mmapThreshold: Int = 32 << 20, trimThreshold: Int = 128 << 20) -> Bool {
        #if canImport(Glibc)
        // mallopt is not in Swift's Glibc module; glibc has had it forever. RTLD_DEFAULT is the null handle.
        typealias Mallopt = @convention(c) (Int32, Int32) -> Int32
        guard let symbol = dlsym(nil, "mallopt"), mmapThreshold > 0, trimThreshold > 0,
            let mmap = Int32(exactly: mmapThreshold), let trim = Int32(exactly: trimThreshold)
        else { return false }
        let mallopt = unsafeBitCast(symbol, to: Mallopt.self)
        let mmapThresholdOption: Int32 = -3, trimThresholdOption: Int32 = -1  // M_MMAP_THRESHOLD, M_TRIM_THRESHOLD
        return mallopt(mmapThresholdOption, mmap) == 1 && mallopt(trimThresholdOption, trim) == 1
        #else
        return false
        #endif
    }
}
