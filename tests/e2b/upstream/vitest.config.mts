// vitest configuration for the upstream E2B JS SDK tests run against hutch
// (see run-upstream.sh). It replaces the upstream vitest.config.mts: one file
// at a time, no browser project, no module mock of the SDK's internals.
import { defineConfig } from 'vitest/config'

export default defineConfig({
  test: {
    include: ['tests/**/*.test.ts'],
    environment: 'node',
    globals: false,
    isolate: true,
    fileParallelism: false,
    testTimeout: Number(process.env.HUTCH_UPSTREAM_TEST_TIMEOUT ?? 180000),
    hookTimeout: Number(process.env.HUTCH_UPSTREAM_TEST_TIMEOUT ?? 180000),
  },
})
