-- Large run documents and run snapshots are stored compressed (zstd) in `packed`, with `body`
-- holding '{}' in their place; every other row keeps its text in `body` and `packed` NULL.
ALTER TABLE resources ADD COLUMN packed BLOB;
