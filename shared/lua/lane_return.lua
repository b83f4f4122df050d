-- Hand a worker's lane back to its model's queue: every message of each of the lane's priority
-- lists moves to the queue's list of the same priority, the oldest ending where the next pop
-- takes it first (kombu pushes on the left and pops on the right).
-- KEYS: the lane's priority lists, then the queue's, in the same order (2n keys). Returns the
-- messages moved.
local n = #KEYS / 2
local moved = 0
for i = 1, n do
  while redis.call('LMOVE', KEYS[i], KEYS[n + i], 'LEFT', 'RIGHT') do
    moved = moved + 1
  end
end
return moved
