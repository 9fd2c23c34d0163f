"""Storage: URIs, writers, upload, repair, index, compaction and check of trace files."""
