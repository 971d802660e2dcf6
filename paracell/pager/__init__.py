"""The Pager: host memory that follows the guest page allocator (docs/pager.md)."""
