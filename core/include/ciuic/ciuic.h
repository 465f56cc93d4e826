// ciuic/ciuic.h — the whole SDK in one include: every header of include/ciuic/ (the kits'
// ciuic/kit/*.h and the conformance kit's ciuic/testing/*.h are separate libraries and not
// included). Convenient, not lean: it pulls in ATen's Tensor and c10d's Store (ciuic/c10d.h); a
// plugin that cares about its compile time includes only the headers it uses.
// tests/arch/arch_test.cpp (Architecture.TheUmbrellaHeaderIncludesTheWholeSdk) keeps this list
// complete; tests/headers compiles it, and tests/sdk compiles it from the installed SDK.
#pragma once
#include <ciuic/c10d.h>
#include <ciuic/checksum.h>
#include <ciuic/comm.h>
#include <ciuic/config.h>
#include <ciuic/context.h>
#include <ciuic/data.h>
#include <ciuic/error.h>
#include <ciuic/export.h>
#include <ciuic/files.h>
#include <ciuic/grad_norm.h>
#include <ciuic/json.h>
#include <ciuic/log.h>
#include <ciuic/metrics.h>
#include <ciuic/optimizer.h>
#include <ciuic/plan.h>
#include <ciuic/plugin.h>
#include <ciuic/precision.h>
#include <ciuic/sharding.h>
#include <ciuic/state.h>
#include <ciuic/store.h>
#include <ciuic/thread_pool.h>
#include <ciuic/tokenizer.h>
#include <ciuic/version.h>
