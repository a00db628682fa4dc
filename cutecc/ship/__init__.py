"""What arrives and leaves: the remote cache, packs and archives, and the one verifier every
arriving entry passes (ingest, vouch).
"""
