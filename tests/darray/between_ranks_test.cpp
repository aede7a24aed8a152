// How GPU data moves between ranks (backend_options::between_ranks): the names, the lines every
// rank of a CUDA backend gathers about its GPUs and the check all ranks make of them
// (darray/src/rank_gpus.hpp: NCCL refuses two ranks on one GPU and names the way out; MPI lets
// them share it; ranks must agree), and host backends, which ignore the option.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "poolscope/darray/backend.hpp"
#include "poolscope/darray/distributed_array.hpp"
#include "poolscope/error.hpp"
#include "rank_gpus.hpp"
#include "test_support.hpp"

namespace poolscope::darray {
namespace {

using detail::rank_gpus;

TEST(between_ranks, names_parse_and_print_back) {
  EXPECT_EQ(parse_rank_transport("auto"), rank_transport::automatic);
  EXPECT_EQ(parse_rank_transport("nccl"), rank_transport::nccl);
  EXPECT_EQ(parse_rank_transport("mpi"), rank_transport::mpi);
  EXPECT_EQ(to_string(rank_transport::automatic), "auto");
  EXPECT_EQ(to_string(rank_transport::nccl), "nccl");
  EXPECT_EQ(to_string(rank_transport::mpi), "mpi");
  EXPECT_EQ(backend_options{}.between_ranks, rank_transport::automatic);
  for (const char* bad : {"", "MPI", "gloo", "mpi ", "automatic", "ipc"}) {
    try {
      (void)parse_rank_transport(bad);
      ADD_FAILURE() << "'" << bad << "' was accepted";
    } catch (const invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("'" + std::string(bad) + "'"), std::string::npos)
          << e.what();
      EXPECT_NE(std::string(e.what()).find("expected auto, nccl or mpi"), std::string::npos)
          << e.what();
    }
  }
}

TEST(between_ranks, gpu_lines_round_trip) {
  const rank_gpus g{"node7", rank_transport::mpi, {"00ff", "a1b2"}, 4194304};
  EXPECT_EQ(detail::encode(g), "node7 mpi/4194304 00ff a1b2");
  const rank_gpus back = detail::decode(detail::encode(g));
  EXPECT_EQ(back.host, "node7");
  EXPECT_EQ(back.between, rank_transport::mpi);
  EXPECT_EQ(back.uuids, (std::vector<std::string>{"00ff", "a1b2"}));
  EXPECT_EQ(back.staging_chunk_bytes, 4194304U);
  EXPECT_TRUE(detail::decode("h nccl").uuids.empty());
  EXPECT_EQ(detail::decode(detail::encode({"h", rank_transport::automatic, {"aa"}})).between,
            rank_transport::automatic);
  EXPECT_EQ(detail::decode("h mpi/0").staging_chunk_bytes, 0U);
  for (const char* bad :
       {"lonely", "h tcp 00ff", "h mpi 00ff", "h mpi/ 00ff", "h mpi/4M 00ff", "h mpi/-1",
        "h nccl/4096 00ff", "h auto/4096", "h mpi/99999999999999999999"}) {
    EXPECT_THROW((void)detail::decode(bad), invalid_argument) << bad;
  }
}

TEST(between_ranks, nccl_refuses_two_ranks_of_a_host_on_one_gpu_and_names_mpi) {
  const std::vector<rank_gpus> ranks{{"h", rank_transport::nccl, {"aa"}},
                                     {"h", rank_transport::nccl, {"bb"}},
                                     {"h", rank_transport::nccl, {"aa"}}};
  const std::string e = detail::rank_gpus_error(ranks);
  EXPECT_NE(e.find("ranks 0 and 2 of host h would use the same GPU (UUID aa)"), std::string::npos)
      << e;
  EXPECT_NE(e.find("NCCL needs a GPU of its own per rank"), std::string::npos) << e;
  EXPECT_NE(e.find("between_ranks = mpi"), std::string::npos) << e;
  EXPECT_NE(e.find("--between-ranks mpi"), std::string::npos) << e;
}

TEST(between_ranks, gpus_of_their_own_or_mpi_pass) {
  // Distinct GPUs; the same UUID text on two hosts (not one GPU); one GPU shared by MPI.
  EXPECT_EQ(detail::rank_gpus_error({{"h", rank_transport::nccl, {"aa", "bb"}},
                                     {"h", rank_transport::nccl, {"cc", "dd"}}}),
            "");
  EXPECT_EQ(detail::rank_gpus_error(
                {{"h1", rank_transport::nccl, {"aa"}}, {"h2", rank_transport::nccl, {"aa"}}}),
            "");
  EXPECT_EQ(detail::rank_gpus_error(
                {{"h", rank_transport::mpi, {"aa"}}, {"h", rank_transport::mpi, {"aa"}}}),
            "");
  // automatic: CUDA IPC joins ranks on one GPU; the backend checks the pairs it leaves to NCCL.
  EXPECT_EQ(detail::rank_gpus_error({{"h", rank_transport::automatic, {"aa"}},
                                     {"h", rank_transport::automatic, {"aa"}}}),
            "");
  EXPECT_EQ(detail::rank_gpus_error({}), "");
}

TEST(between_ranks, ranks_that_choose_differently_are_refused_alike) {
  const std::string e = detail::rank_gpus_error({{"h", rank_transport::mpi, {"aa"}},
                                                 {"h", rank_transport::mpi, {"bb"}},
                                                 {"h", rank_transport::nccl, {"cc"}}});
  EXPECT_NE(e.find("rank 0 moves data between ranks by mpi in whole pieces and rank 2 by nccl"),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("every rank must choose the same"), std::string::npos) << e;
}

// By MPI, the ranks cut each piece alike or a receive would wait for chunks of another size.
TEST(between_ranks, ranks_that_cut_pieces_differently_are_refused_alike) {
  const std::string e = detail::rank_gpus_error(
      {{"h", rank_transport::mpi, {"aa"}, 4 << 20}, {"h", rank_transport::mpi, {"aa"}, 1 << 20}});
  EXPECT_NE(e.find("rank 0 moves data between ranks by mpi in chunks of 4.00 MiB (4194304 B) and "
                   "rank 1 by mpi in chunks of 1.00 MiB"),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("--staging-chunk"), std::string::npos) << e;
  // With NCCL the chunks play no part.
  EXPECT_EQ(detail::rank_gpus_error({{"h", rank_transport::nccl, {"aa"}, 4 << 20},
                                     {"h", rank_transport::nccl, {"bb"}, 0}}),
            "");
}

// The host of the check of two ranks on one GPU is NCCL's: NCCL_HOSTID where set, as NCCL takes
// it, so ranks that NCCL joins as hosts apart (its network transport, on loopback) are not refused.
TEST(between_ranks, the_host_of_the_gpu_check_follows_nccl_hostid) {
  EXPECT_EQ(detail::nccl_host("node7", nullptr), "node7");
  EXPECT_EQ(detail::nccl_host("node7", ""), "node7");
  EXPECT_EQ(detail::nccl_host("node7", "rank1"), "rank1");
  EXPECT_EQ(detail::nccl_host("node7", "rank 1\t"), "rank_1_");  // encode() splits at spaces
  EXPECT_EQ(
      detail::decode(detail::encode({detail::nccl_host("h", "a b"), rank_transport::nccl, {"aa"}}))
          .host,
      "a_b");
  const auto on_one_gpu = [](const char* id0, const char* id1) {
    return detail::rank_gpus_error({{detail::nccl_host("h", id0), rank_transport::nccl, {"aa"}},
                                    {detail::nccl_host("h", id1), rank_transport::nccl, {"aa"}}});
  };
  EXPECT_EQ(on_one_gpu("r0", "r1"), "");
  EXPECT_NE(on_one_gpu(nullptr, nullptr).find("ranks 0 and 1 of host h would use the same GPU"),
            std::string::npos);
  EXPECT_NE(on_one_gpu("r0", "r0").find("ranks 0 and 1 of host r0"), std::string::npos);
}

// Host devices always move data between ranks by MPI: the option changes nothing there (under
// mpirun, the pieces still cross ranks and the values match).
TEST(between_ranks, host_backends_ignore_it) {
  for (const rank_transport t :
       {rank_transport::automatic, rank_transport::nccl, rank_transport::mpi}) {
    backend_options o;
    o.group = test_support::test_group();
    o.between_ranks = t;
    const auto be = make_host_backend(2, o);
    const int devs = be->device_count();
    const std::int64_t n = 1000;
    std::vector<std::int64_t> v(static_cast<std::size_t>(n));
    for (std::size_t i = 0; i < v.size(); ++i) {
      v[i] = static_cast<std::int64_t>(i) * 3;
    }
    auto a =
        distributed_array<std::int64_t>::from_host(be, v, {n}, index_map::blocks({n}, 0, devs));
    auto r = a.reshard(index_map::replicated({n}, {devs - 1}));
    EXPECT_EQ(r.to_host(), v) << to_string(t);
  }
}

}  // namespace
}  // namespace poolscope::darray
