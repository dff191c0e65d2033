"""LeaseKeeper on its own: hold a lease while working, fence writes, stop when the lease is lost.

    python examples/lease_keeper.py                        # in-memory provider
    python examples/lease_keeper.py --redis-url redis://127.0.0.1:6379/0

1. Worker ``a`` holds the lease for longer than its TTL (the keeper renews it); ``b`` is denied.
2. ``a`` finishes and the keeper releases the lease; ``b`` gets it with a higher fencing token.
3. An operator hands ``b``'s lease to ``c`` (``transfer_lease``). ``b``'s next renew is
   rejected, its work is cancelled, and its late write is refused by the fenced store.
"""

from __future__ import annotations

import argparse
import uuid

import anyio

from leases import InMemoryLeaseProvider, LeaseKeeper, LeaseProvider, RedisLeaseProvider

TTL_MS = 300


class FencedStore:
    """A resource that accepts a write only with a token at least as high as any seen before."""

    def __init__(self) -> None:
        self.highest = 0
        self.log: list[str] = []

    def write(self, token: int | None, text: str) -> bool:
        if token is None or token < self.highest:
            print(f"  store: REFUSED {text!r} (token {token} < {self.highest})")
            return False
        self.highest = token
        self.log.append(text)
        print(f"  store: wrote {text!r} with token {token}")
        return True


async def demo(provider: LeaseProvider) -> None:
    key = f"thread-{uuid.uuid4().hex[:6]}"
    store = FencedStore()

    print(f"1. a holds {key!r} for {3 * TTL_MS} ms with a {TTL_MS} ms TTL")
    async with LeaseKeeper(provider, key, "a", TTL_MS) as keeper:
        for step in range(3):
            await anyio.sleep(TTL_MS / 1000)
            store.write(keeper.token, f"a step {step}")
        denied = await provider.acquire_lease(key, "b", TTL_MS)
        print(f"  b tries: acquired={denied.acquired}, owner={denied.owner}")
    print(f"  a done: lost={keeper.lost}; owner now {await provider.get_lease_owner(key)}")

    print("2. b takes the free lease")
    b = LeaseKeeper(provider, key, "b", TTL_MS)
    async with b:
        print(f"  b holds it with token {b.token} (a had {keeper.token})")
        store.write(b.token, "b step 0")

        print("3. an operator hands the lease to c while b is still working")
        assert await provider.transfer_lease(key, "b", "c", 10 * TTL_MS)
        c_token = (await provider.acquire_lease(key, "c", 10 * TTL_MS)).token
        store.write(c_token, "c takes over")
        await anyio.sleep(10)  # b's work: cancelled when its next renew is rejected
        print("  (never printed)")
    print(f"  b's body was cancelled: lost={b.lost}, reason={b.lost_reason!r}")
    store.write(b.token, "b late write")  # a zombie's write: refused by the fence
    await provider.release_lease(key, "c")
    print(f"store log: {store.log}")


async def main(redis_url: str | None) -> None:
    if redis_url is None:
        print("provider: InMemoryLeaseProvider")
        await demo(InMemoryLeaseProvider())
        return
    print(f"provider: RedisLeaseProvider at {redis_url}")
    async with RedisLeaseProvider(url=redis_url, key_prefix="example") as provider:
        await demo(provider)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="LeaseKeeper demo")
    parser.add_argument("--redis-url", help="run on Redis instead of in memory")
    args = parser.parse_args()
    anyio.run(main, args.redis_url)
