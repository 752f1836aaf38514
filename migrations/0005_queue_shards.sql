-- Issue 20: a sale's waiting-room queue is spread over `queue_shards`
-- Durable Objects at the edge (published in the sale summary as
-- `queue.shards`). Fixed at creation: people may join the queue from then
-- on, and an account's shard depends on the count.
ALTER TABLE sales
    ADD COLUMN queue_shards integer NOT NULL DEFAULT 1
        CHECK (queue_shards BETWEEN 1 AND 256);
