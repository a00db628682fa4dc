"""What a cache entry is, in the base layer: the rules a valid one follows (`rules`: formats,
its key, its label, the checks on its meta.json) and its metadata as typed records
(`meta`: `EntryMeta`, `RuntimeMeta`). The store, the lock, the runtime and the build all
read entries through these two modules; neither imports anything of the build side."""
