"""The five schedules of Halide's tutorial lesson 24 (async execution), as generators with
the lesson's definitions and no inputs:

- async_producer:          producer.compute_root().async()
- async_two_producers:     two compute_root().async() producers, one consumer
- async_fold_storage:      double buffering over planes with fold_storage(c, 2)
- async_ring_buffer:       the same with hoist_storage + ring_buffer(2)
- async_ring_buffer_tiled: ring_buffer(2) over 16x16 tiles of each plane

Their producers and consumers run on different threads of the thread pool, synchronized by
semaphores (halide_semaphore_*), which is what the shim's thread pool must serve.
"""

import halide as hl

GENERATOR_NAMES = ["async_producer", "async_two_producers", "async_fold_storage",
                   "async_ring_buffer", "async_ring_buffer_tiled"]

x, y, c, xo, yo, xi, yi = hl.vars("x y c xo yo xi yi")


def _planes():
    producer, consumer = hl.Func("producer"), hl.Func("consumer")
    producer[x, y, c] = (x + y) * (c + 1)
    consumer[x, y, c] = producer[x - 1, y - 1, c] + producer[x, y, c] + producer[x + 1, y + 1, c]
    consumer.compute_root()
    return producer, consumer


@hl.generator(name="async_producer")
class AsyncProducer:
    output = hl.OutputBuffer(hl.Int(32), 2)

    def generate(self):
        producer = hl.Func("producer")
        producer[x, y] = x + y
        self.output[x, y] = producer[x - 1, y - 1] + producer[x, y] + producer[x + 1, y + 1]
        producer.compute_root().async_()


@hl.generator(name="async_two_producers")
class AsyncTwoProducers:
    output = hl.OutputBuffer(hl.Int(32), 2)

    def generate(self):
        producer1, producer2 = hl.Func("producer1"), hl.Func("producer2")
        producer1[x, y] = x + y
        producer2[x, y] = x + y
        self.output[x, y] = producer1[x - 1, y - 1] + producer2[x, y] + producer1[x + 1, y + 1]
        producer1.compute_root().async_()
        producer2.compute_root().async_()


@hl.generator(name="async_fold_storage")
class AsyncFoldStorage:
    output = hl.OutputBuffer(hl.Int(32), 3)

    def generate(self):
        producer, consumer = _planes()
        self.output[x, y, c] = consumer[x, y, c]
        producer.async_().compute_at(consumer, c).store_at(consumer, hl.Var.outermost()) \
            .fold_storage(c, 2)


@hl.generator(name="async_ring_buffer")
class AsyncRingBuffer:
    output = hl.OutputBuffer(hl.Int(32), 3)

    def generate(self):
        producer, consumer = _planes()
        self.output[x, y, c] = consumer[x, y, c]
        producer.async_().compute_at(consumer, c).hoist_storage(consumer, hl.Var.outermost()) \
            .ring_buffer(2)


@hl.generator(name="async_ring_buffer_tiled")
class AsyncRingBufferTiled:
    output = hl.OutputBuffer(hl.Int(32), 3)

    def generate(self):
        producer, consumer = _planes()
        self.output[x, y, c] = consumer[x, y, c]
        consumer.tile(x, y, xo, yo, xi, yi, 16, 16, hl.TailStrategy.Auto)
        producer.async_().compute_at(consumer, xo).hoist_storage(consumer, hl.Var.outermost()) \
            .ring_buffer(2)


if __name__ == "__main__":
    hl.main()
