"""The ground floor: errors, settings declarations, atomic writes, run folders, signals, device,
distributed processes, precision and the allocator. Imports nothing else of fewshot."""
